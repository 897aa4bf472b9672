package kvindex

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex/kvevents"
)

// clock is a manual clock for tests.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

const bs = 4 // block size used by these tests

// newTestIndex is the one fixture: an index with model "m" (block size 4), a manual
// clock, and options adjusted by opts. Please extend it with opts rather than adding
// siblings.
func newTestIndex(t *testing.T, opts ...func(*Options)) (*Index, *clock) {
	t.Helper()
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	o := Options{SpeculativeTTL: 10 * time.Second, Models: []Model{{Name: "m", BlockSize: bs}}, Now: c.Now}
	for _, f := range opts {
		f(&o)
	}
	return New(o), c
}

// toks returns n blocks of tokens starting at token value from.
func toks(from, n int) []uint32 {
	out := make([]uint32, n*bs)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func keysOf(model string, tokens []uint32) []Key {
	return HashBlocks(Namespace{Model: model}.Seed(), tokens, bs, nil)
}

func stored(hashes []uint64, parent *uint64, tokens []uint32) kvevents.Event {
	e := kvevents.Event{Type: kvevents.TypeBlockStored, TokenIDs: tokens, BlockSize: bs, Medium: "GPU", SpecKind: "full_attention"}
	for _, h := range hashes {
		e.BlockHashes = append(e.BlockHashes, kvevents.Uint(h))
	}
	if parent != nil {
		p := kvevents.Uint(*parent)
		e.Parent = &p
	}
	return e
}

func removed(hashes ...uint64) kvevents.Event {
	e := kvevents.Event{Type: kvevents.TypeBlockRemoved, Medium: "GPU"}
	for _, h := range hashes {
		e.BlockHashes = append(e.BlockHashes, kvevents.Uint(h))
	}
	return e
}

// apply encodes evs as vLLM would and applies the payload.
func apply(t *testing.T, ix *Index, worker string, rank int, evs ...kvevents.Event) {
	t.Helper()
	p, err := kvevents.Encode(&kvevents.Batch{TS: 1, Events: evs, DPRank: rank, HasDPRank: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := ix.ApplyPayload(worker, rank, p); err != nil {
		t.Fatal(err)
	}
}

func blocksOf(ms []Match) map[string]int {
	out := map[string]int{}
	for _, m := range ms {
		out[m.Worker] = m.Blocks
	}
	return out
}

func addWorkers(ix *Index, names ...string) {
	for _, n := range names {
		ix.SetWorker(WorkerInfo{Name: n, Model: "m", Events: true})
	}
}

func u(v uint64) *uint64 { return &v }

func TestStoredChainMatchesRequestKeys(t *testing.T) {
	ix, _ := newTestIndex(t)
	addWorkers(ix, "a", "b")
	all := toks(100, 6)
	// a: 4 blocks in two chunks (chunked prefill: the second names the first's last block).
	apply(t, ix, "a", 0, stored([]uint64{11, 12}, nil, all[:2*bs]))
	apply(t, ix, "a", 0, stored([]uint64{13, 14}, u(12), all[2*bs:4*bs]))
	// b: 2 blocks, with its own (random per process) engine hashes.
	apply(t, ix, "b", 0, stored([]uint64{901, 902}, nil, all[:2*bs]))
	got := blocksOf(ix.Lookup(keysOf("m", all), nil))
	if got["a"] != 4 || got["b"] != 2 || len(got) != 2 {
		t.Fatalf("lookup = %v, want a:4 b:2 (keys are kvroute's own chained hashes, engine hashes only resolve parents)", got)
	}
	// Another model's namespace never matches the same tokens.
	if ms := ix.Lookup(keysOf("other", all), nil); len(ms) != 0 {
		t.Fatalf("other model matched: %v", ms)
	}
	// A prompt diverging after block 1 matches 1 block.
	div := append(append([]uint32{}, all[:bs]...), toks(999, 3)...)
	if got := blocksOf(ix.Lookup(keysOf("m", div), nil)); got["a"] != 1 || got["b"] != 1 {
		t.Fatalf("diverging prompt: %v", got)
	}
}

func TestDuplicateStoresAndRemovesAreRefCounted(t *testing.T) {
	ix, _ := newTestIndex(t)
	addWorkers(ix, "a")
	tk := toks(1, 1)
	keys := keysOf("m", tk)
	apply(t, ix, "a", 0, stored([]uint64{5}, nil, tk), stored([]uint64{5}, nil, tk))
	apply(t, ix, "a", 0, removed(5))
	if got := blocksOf(ix.Lookup(keys, nil)); got["a"] != 1 {
		t.Fatalf("after 2 stores and 1 remove the block is still cached; got %v", got)
	}
	apply(t, ix, "a", 0, removed(5))
	if ms := ix.Lookup(keys, nil); len(ms) != 0 {
		t.Fatalf("after 2 removes the block is gone; got %v", ms)
	}
	apply(t, ix, "a", 0, removed(5)) // a third remove is an anomaly, not a crash
	if ix.Entries() != 0 || ix.Keys() != 0 {
		t.Fatalf("entries %d keys %d, want 0", ix.Entries(), ix.Keys())
	}
}

func TestAllBlocksCleared(t *testing.T) {
	ix, _ := newTestIndex(t)
	addWorkers(ix, "a", "b")
	tk := toks(1, 3)
	apply(t, ix, "a", 0, stored([]uint64{1, 2, 3}, nil, tk))
	apply(t, ix, "b", 0, stored([]uint64{1, 2, 3}, nil, tk))
	apply(t, ix, "a", 0, kvevents.Event{Type: kvevents.TypeAllBlocksCleared})
	if got := blocksOf(ix.Lookup(keysOf("m", tk), nil)); len(got) != 1 || got["b"] != 3 {
		t.Fatalf("AllBlocksCleared clears only its worker: %v", got)
	}
	// Hashes are reusable after a clear.
	apply(t, ix, "a", 0, stored([]uint64{1}, nil, tk[:bs]))
	if got := blocksOf(ix.Lookup(keysOf("m", tk), nil)); got["a"] != 1 {
		t.Fatalf("%v", got)
	}
}

func TestTwoDPRanks(t *testing.T) {
	ix, _ := newTestIndex(t)
	addWorkers(ix, "a")
	tk := toks(1, 2)
	keys := keysOf("m", tk)
	apply(t, ix, "a", 0, stored([]uint64{1, 2}, nil, tk))
	apply(t, ix, "a", 1, stored([]uint64{1, 2}, nil, tk)) // same hashes, another process
	apply(t, ix, "a", 1, stored([]uint64{3}, u(2), toks(50, 1)))
	apply(t, ix, "a", 0, removed(1, 2))
	if got := blocksOf(ix.Lookup(keys, nil)); got["a"] != 2 {
		t.Fatalf("rank 1 still holds both blocks: %v", got)
	}
	ix.ResetRank("a", 1) // rank 1 restarted
	if ms := ix.Lookup(keys, nil); len(ms) != 0 {
		t.Fatalf("after both ranks lost the blocks: %v", ms)
	}
	if ix.Entries() != 0 {
		t.Fatalf("entries %d", ix.Entries())
	}
}

func TestTiers(t *testing.T) {
	ix, _ := newTestIndex(t)
	addWorkers(ix, "a")
	tk := toks(1, 3)
	apply(t, ix, "a", 0, stored([]uint64{1, 2, 3}, nil, tk))
	cpu := stored([]uint64{1, 2, 3}, nil, tk)
	cpu.Medium = "CPU"
	apply(t, ix, "a", 0, cpu)
	rm := removed(2, 3)
	apply(t, ix, "a", 0, rm) // evicted from GPU, still offloaded on CPU
	ms := ix.Lookup(keysOf("m", tk), nil)
	if len(ms) != 1 || ms[0].Blocks != 3 || ms[0].ByTier[TierGPU] != 1 || ms[0].ByTier[TierCPU] != 2 {
		t.Fatalf("tiers: %+v, want 1 GPU + 2 CPU", ms)
	}
}

func TestOnlyFullAttentionGroupsIndexed(t *testing.T) {
	ix, _ := newTestIndex(t)
	addWorkers(ix, "a")
	tk := toks(1, 2)
	sw := stored([]uint64{1, 2}, nil, tk)
	sw.SpecKind, sw.GroupIdx = "sliding_window", 1
	apply(t, ix, "a", 0, sw)
	if ms := ix.Lookup(keysOf("m", tk), nil); len(ms) != 0 {
		t.Fatalf("sliding-window group indexed: %v", ms)
	}
	apply(t, ix, "a", 0, stored([]uint64{1, 2}, nil, tk))
	rm := removed(1, 2)
	rm.GroupIdx = 1 // the sliding-window group's removal must not release group 0's blocks
	apply(t, ix, "a", 0, rm)
	if got := blocksOf(ix.Lookup(keysOf("m", tk), nil)); got["a"] != 2 {
		t.Fatalf("%v", got)
	}
}

func TestNamespaces(t *testing.T) {
	ix, _ := newTestIndex(t)
	addWorkers(ix, "a")
	tk := toks(1, 2)
	e := stored([]uint64{1, 2}, nil, tk)
	e.LoRAName = "ad"
	e.ExtraKeys = []any{[]any{"ad", "salty"}, []any{"ad"}}
	apply(t, ix, "a", 0, e)
	want := HashBlocks(Namespace{Model: "m", LoRA: "ad", CacheSalt: "salty"}.Seed(), tk, bs, nil)
	if got := blocksOf(ix.Lookup(want, nil)); got["a"] != 2 {
		t.Fatalf("LoRA + cache_salt namespace: %v", got)
	}
	if ms := ix.Lookup(keysOf("m", tk), nil); len(ms) != 0 {
		t.Fatalf("base namespace matched adapter blocks: %v", ms)
	}
	// Multimodal extra keys make the block unmatchable by token-only keys.
	mm := stored([]uint64{7}, nil, toks(500, 1))
	mm.ExtraKeys = []any{[]any{"img-hash", int8(0)}}
	apply(t, ix, "a", 0, mm)
	if ms := ix.Lookup(keysOf("m", toks(500, 1)), nil); len(ms) != 0 {
		t.Fatalf("multimodal block matched token-only keys: %v", ms)
	}
}

func TestSpeculativeEntries(t *testing.T) {
	ix, c := newTestIndex(t)
	addWorkers(ix, "a", "b")
	tk := toks(1, 3)
	keys := keysOf("m", tk)
	ix.Speculate("a", keys)
	ix.Speculate("b", keys[:2])
	if got := blocksOf(ix.Lookup(keys, nil)); got["a"] != 3 || got["b"] != 2 {
		t.Fatalf("speculative: %v", got)
	}
	// a's events confirm block 0 only.
	apply(t, ix, "a", 0, stored([]uint64{1}, nil, tk[:bs]))
	c.Add(11 * time.Second)
	if got := blocksOf(ix.Lookup(keys, nil)); len(got) != 1 || got["a"] != 1 {
		t.Fatalf("after the TTL only the confirmed block remains: %v", got)
	}
	ix.Sweep()
	if ix.Entries() != 1 {
		t.Fatalf("entries after sweep %d, want 1", ix.Entries())
	}
}

func TestApproximateWorkerBoundedByCapacity(t *testing.T) {
	ix, c := newTestIndex(t)
	ix.SetWorker(WorkerInfo{Name: "x", Model: "m", BlockCapacity: 4}) // no events
	if m := ix.Mode("x"); m != ModeApproximate {
		t.Fatalf("mode %v", m)
	}
	old := keysOf("m", toks(1, 3))
	ix.Speculate("x", old)
	c.Add(time.Hour) // no TTL for a worker without events
	if got := blocksOf(ix.Lookup(old, nil)); got["x"] != 3 {
		t.Fatalf("approximate entries expired: %v", got)
	}
	newer := keysOf("m", toks(100, 3))
	ix.Speculate("x", newer)
	if got := blocksOf(ix.Lookup(newer, nil)); got["x"] != 3 {
		t.Fatalf("newest request: %v", got)
	}
	// capacity 4: 2 of old's blocks were evicted, tail first, so its prefix of 1 remains
	if got := blocksOf(ix.Lookup(old, nil)); got["x"] != 1 {
		t.Fatalf("LRU eviction tail first: %v, want x:1", got)
	}
	if ix.Entries() != 4 {
		t.Fatalf("entries %d, want capacity 4", ix.Entries())
	}
}

func TestMalformedPayloadDroppedWhole(t *testing.T) {
	ix, _ := newTestIndex(t)
	addWorkers(ix, "a")
	tk := toks(1, 2)
	good, _ := kvevents.Encode(&kvevents.Batch{TS: 1, Events: []kvevents.Event{stored([]uint64{1, 2}, nil, tk)}})
	bad := append([]byte{}, good[:len(good)-3]...)
	if err := ix.ApplyPayload("a", 0, bad); !errors.Is(err, kvevents.ErrMalformed) {
		t.Fatalf("err %v", err)
	}
	if ix.Entries() != 0 {
		t.Fatal("a malformed payload was half applied")
	}
	if err := ix.ApplyPayload("a", 0, good); err != nil {
		t.Fatal(err)
	}
	if got := blocksOf(ix.Lookup(keysOf("m", tk), nil)); got["a"] != 2 {
		t.Fatalf("%v", got)
	}
}

func TestDesyncAndCoverage(t *testing.T) {
	ix, _ := newTestIndex(t)
	ix.SetWorker(WorkerInfo{Name: "a", Model: "m", Events: true, BlockCapacity: 2})
	staleT := toks(1, 2)
	apply(t, ix, "a", 0, stored([]uint64{1, 2}, nil, staleT))
	if ix.Mode("a") != ModeExact {
		t.Fatal("events in sync: exact")
	}
	ix.Desync("a") // lost events (e.g. the removal of 1, 2)
	if ix.Mode("a") != ModeApproximate {
		t.Fatal("desync: approximate")
	}
	if got := blocksOf(ix.Lookup(keysOf("m", staleT), nil)); got["a"] != 2 {
		t.Fatalf("stale entries still count while approximate: %v", got)
	}
	fresh := toks(100, 2)
	apply(t, ix, "a", 0, stored([]uint64{3, 4}, nil, fresh)) // capacity 2 covered
	if ix.Mode("a") != ModeExact {
		t.Fatalf("covered: exact, got %v", ix.Mode("a"))
	}
	if ms := ix.Lookup(keysOf("m", staleT), nil); len(ms) != 0 {
		t.Fatalf("stale entries dropped at coverage: %v", ms)
	}
	if got := blocksOf(ix.Lookup(keysOf("m", fresh), nil)); got["a"] != 2 {
		t.Fatalf("%v", got)
	}
}

func TestRemoveWorkerReleasesEverything(t *testing.T) {
	ix, _ := newTestIndex(t)
	addWorkers(ix, "a", "b")
	tk := toks(1, 3)
	apply(t, ix, "a", 0, stored([]uint64{1, 2, 3}, nil, tk))
	apply(t, ix, "b", 0, stored([]uint64{1, 2, 3}, nil, tk))
	ix.Speculate("a", keysOf("m", toks(40, 2)))
	ix.RemoveWorker("a")
	if got := blocksOf(ix.Lookup(keysOf("m", tk), nil)); len(got) != 1 || got["b"] != 3 {
		t.Fatalf("%v", got)
	}
	if ix.Entries() != 3 || ix.Keys() != 3 {
		t.Fatalf("entries %d keys %d, want 3 3", ix.Entries(), ix.Keys())
	}
	// The freed id is reused by a new worker without inheriting anything.
	addWorkers(ix, "c")
	if got := blocksOf(ix.Lookup(keysOf("m", tk), nil)); got["c"] != 0 {
		t.Fatalf("%v", got)
	}
}

func TestMemoryCapEvicts(t *testing.T) {
	const limit = 64 << 10
	ix, _ := newTestIndex(t, func(o *Options) { o.MaxBytes = limit })
	addWorkers(ix, "a")
	var h uint64
	for i := 0; i < 200; i++ { // 200 chains of 8 blocks ≫ the cap
		hs := make([]uint64, 8)
		for j := range hs {
			h++
			hs[j] = h
		}
		apply(t, ix, "a", 0, stored(hs, nil, toks(i*1000, 8)))
	}
	if b := ix.Bytes(); b > limit {
		t.Fatalf("bytes %d over the cap %d", b, limit)
	}
	if ix.Entries() == 0 {
		t.Fatal("evicted everything")
	}
}

// Many workers on one key exercise the overflow chunks (grow and shrink across size
// classes); the holders must stay exact.
func TestManyHoldersPerKey(t *testing.T) {
	ix, _ := newTestIndex(t)
	var names []string
	for i := 0; i < 40; i++ {
		names = append(names, string(rune('A'+i)))
	}
	addWorkers(ix, names...)
	tk := toks(1, 2)
	keys := keysOf("m", tk)
	for i, n := range names {
		apply(t, ix, n, 0, stored([]uint64{uint64(i*10 + 1), uint64(i*10 + 2)}, nil, tk))
	}
	check := func(want map[string]int) {
		t.Helper()
		got := blocksOf(ix.Lookup(keys, nil))
		if len(got) != len(want) {
			t.Fatalf("got %d workers, want %d", len(got), len(want))
		}
		for n, b := range want {
			if got[n] != b {
				t.Fatalf("%s: %d blocks, want %d", n, got[n], b)
			}
		}
	}
	want := map[string]int{}
	for _, n := range names {
		want[n] = 2
	}
	check(want)
	// remove block 1 from every other worker, then block 0 from all but 1 worker
	for i, n := range names {
		if i%2 == 0 {
			apply(t, ix, n, 0, removed(uint64(i*10+2)))
			want[n] = 1
		}
	}
	check(want)
	for i, n := range names[1:] {
		apply(t, ix, n, 0, removed(uint64((i+1)*10+1)))
		delete(want, n)
	}
	check(want)
	if ix.Keys() != 2 || ix.Entries() != 21 { // key 0: A; key 1: the 20 odd workers
		t.Fatalf("keys %d entries %d", ix.Keys(), ix.Entries())
	}
}
