package kvindex

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// refLookup is Lookup by definition: per worker, holder by holder (peek), the leading
// keys whose holder is live, counted in its fastest tier.
func refLookup(ix *Index, keys []Key) map[string]Match {
	now := ix.tick()
	out := map[string]Match{}
	for _, name := range ix.Workers() {
		w := ix.worker(name)
		m := Match{Worker: name}
		for _, k := range keys {
			h, ok := ix.peek(k, w.id)
			if !ok {
				break
			}
			t, live := h.live(now)
			if !live {
				break
			}
			m.Blocks++
			m.ByTier[t]++
		}
		if m.Blocks > 0 {
			out[name] = m
		}
	}
	return out
}

// TestLookupMatchesReference checks both walks (bitset for ≤ 64 workers holding the
// first key, counters above) against refLookup on random prefixes with holes, tiers,
// and speculative entries, some of them expired.
func TestLookupMatchesReference(t *testing.T) {
	for _, workers := range []int{3, 64, 65, 130} {
		t.Run(fmt.Sprint(workers), func(t *testing.T) {
			ix, clk := newTestIndex(t)
			r := rand.New(rand.NewPCG(uint64(workers), 7))
			keys := keysOf("m", toks(1, 300))
			for j := 0; j < workers; j++ {
				name := fmt.Sprintf("w%03d", j)
				ix.SetWorker(WorkerInfo{Name: name, Model: "m", Events: true})
				held := r.IntN(len(keys) + 1)
				switch r.IntN(4) {
				case 0: // one tier
					ix.Store(name, Tier(r.IntN(int(NumTiers))), keys[:held])
				case 1: // GPU prefix, CPU beyond, a hole
					ix.Store(name, TierGPU, keys[:held/2])
					ix.Store(name, TierCPU, keys[:held])
					if held > 2 {
						ix.Remove(name, keys[held/3:held/3+1])
					}
				case 2: // speculative, booked now or earlier
					ix.Speculate(name, keys[:held])
				default: // nothing
				}
				if j%7 == 0 {
					clk.Add(3 * time.Second) // earlier bookings expire first
				}
			}
			for step := 0; step < 5; step++ {
				got := ix.Lookup(keys, nil)
				want := refLookup(ix, keys)
				if step == 0 && workers == 130 && len(got) <= 64 {
					t.Fatalf("only %d workers hold the first key: the counter walk is not exercised", len(got))
				}
				if len(got) != len(want) {
					t.Fatalf("step %d: %d matches, want %d", step, len(got), len(want))
				}
				for _, m := range got {
					if m != want[m.Worker] {
						t.Fatalf("step %d: %+v, want %+v", step, m, want[m.Worker])
					}
				}
				clk.Add(2 * time.Second)
			}
		})
	}
}

// Key 0 (its table slot is key 1's, rhKey) is found by both walks like any other key:
// the walks take each key's shard and home from one mix (groupMix), and key 0's shard
// is its own while its home is 1's. Keys past the first group exercise the read-ahead.
func TestLookupKeyZero(t *testing.T) {
	for _, workers := range []int{2, 70} {
		ix, _ := newTestIndex(t)
		keys := []Key{7, 0, 9, 1}
		for i := range 20 {
			keys = append(keys, Key(mix64(uint64(i)+100)), 0)
		}
		for j := range workers {
			name := fmt.Sprintf("w%03d", j)
			ix.SetWorker(WorkerInfo{Name: name, Model: "m", Events: true})
			ix.Store(name, TierGPU, keys[:len(keys)-j%3])
		}
		got := map[string]Match{}
		for _, m := range ix.Lookup(keys, nil) {
			got[m.Worker] = m
		}
		want := refLookup(ix, keys)
		if len(got) != workers || len(want) != workers {
			t.Fatalf("%d workers: got %d matches, reference %d", workers, len(got), len(want))
		}
		for name, m := range want {
			if got[name] != m {
				t.Fatalf("%d workers, %s: got %+v, want %+v", workers, name, got[name], m)
			}
		}
	}
}
