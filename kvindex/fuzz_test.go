package kvindex

import (
	"testing"

	"github.com/kvroute/kvroute/kvindex/kvevents"
)

// checkInvariants verifies that every worker's incremental counters agree with a full
// walk of its engine entries, and that every engine entry's key has this worker as a
// holder with the same tiers.
func checkInvariants(t *testing.T, ix *Index) {
	t.Helper()
	var total int64
	for _, name := range ix.Workers() {
		w := ix.worker(name)
		byTier, eng := tierCounts(ix, name)
		w.mu.Lock()
		if w.nEng != eng || w.tierEng != byTier {
			t.Fatalf("%s: counters nEng %d tiers %v, walk %d %v", name, w.nEng, w.tierEng, eng, byTier)
		}
		if w.specLive < 0 || w.specLive > len(w.fifo) {
			t.Fatalf("%s: %d live speculative entries, %d in the FIFO", name, w.specLive, len(w.fifo))
		}
		for _, r := range w.ranks {
			for _, it := range r.items(0, -1) {
				if _, ok := ix.peek(it.e.key, w.id); !ok {
					t.Fatalf("%s: engine entry %x → key %x without a holder", name, it.eh, it.e.key)
				}
			}
		}
		w.mu.Unlock()
		total += int64(eng)
	}
	if n := ix.nEng.Load(); n != total {
		t.Fatalf("index engine entries %d, workers' %d", n, total)
	}
}

// opsBatch turns 4 bytes into one event of a small alphabet (so that the fuzzer
// produces chains, duplicate stores, removals of known and unknown hashes, tier moves,
// clears, bad events and skipped groups): op, hash, parent, token seed.
func opsEvent(b []byte) kvevents.Event {
	h := uint64(b[1] % 16)
	n := 1 + int(b[1]>>4)%3
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = h + uint64(i)
	}
	var parent *uint64
	if b[2]%4 != 0 {
		parent = u(uint64(b[2] % 16))
	}
	tk := toks(int(b[3]%4), n)
	switch b[0] % 8 {
	case 0, 1, 2:
		e := stored(hs, parent, tk)
		if b[0]&0x80 != 0 {
			e.Medium = "CPU"
		}
		return e
	case 3:
		e := stored(hs, parent, tk[:len(tk)-1]) // inconsistent: dropped alone
		return e
	case 4:
		e := stored(hs, parent, tk)
		e.SpecKind, e.GroupIdx = "sliding_window", 1
		return e
	case 5, 6:
		e := removed(hs...)
		if b[0]&0x80 != 0 {
			e.Medium = "CPU"
		}
		return e
	}
	return kvevents.Event{Type: kvevents.TypeAllBlocksCleared}
}

// FuzzApply applies a sequence of event batches built from data (4 bytes per event; a
// batch ends after an event whose first byte has bit 6 set) to two workers and two
// ranks, with speculation, lookups, expiry sweeps, desyncs and the memory cap in
// between, bookings withdrawn, through ApplyBatch or the wire (Encode → ApplyPayload → decoder). It
// asserts no panic and, after every batch, that the incremental counters agree with
// the tables (checkInvariants).
func FuzzApply(f *testing.F) {
	f.Add([]byte{0, 0x10, 0, 0, 0, 0x12, 1, 0, 0x45, 0x11, 0, 0})
	f.Add([]byte{0x80, 0x20, 0, 1, 0, 0x20, 0, 1, 0xc5, 0x20, 0, 1, 7, 0, 0, 0})
	f.Add([]byte{3, 0x13, 0, 0, 4, 0x13, 0, 0, 0x40, 0x14, 0, 0, 5, 0x24, 1, 2})
	f.Add([]byte{0x2a, 0x31, 5, 2, 0x5b, 0x07, 0, 3, 0x46, 0x0e, 9, 1, 0x4f, 0x20, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		ix, clk := newTestIndex(t, func(o *Options) { o.MaxBytes = 4 << 10 })
		addWorkers(ix, "a", "b")
		ks := keysOf("m", toks(0, 4))
		var evs []kvevents.Event
		batch := 0
		for len(data) >= 4 {
			b := data[:4]
			data = data[4:]
			evs = append(evs, opsEvent(b))
			if b[0]&0x40 == 0 && len(data) >= 4 {
				continue
			}
			w, rank := "a", int(b[2]>>6)&1
			if b[3]&0x80 != 0 {
				w = "b"
			}
			bt := &kvevents.Batch{TS: 1, Events: evs, DPRank: rank, HasDPRank: true}
			if b[3]&0x40 != 0 {
				p, err := kvevents.Encode(bt)
				if err != nil {
					t.Fatal(err)
				}
				if err := ix.ApplyPayload(w, rank, p); err != nil {
					t.Fatalf("ApplyPayload of an encoded batch: %v", err)
				}
			} else if err := ix.ApplyBatch(w, rank, bt); err != nil {
				t.Fatal(err)
			}
			evs = nil
			batch++
			bk := ix.Book(w, ks[:1+batch%len(ks)])
			_ = ix.Lookup(ks, nil)
			if b[2]&0x20 != 0 {
				ix.Withdraw(bk) // the request failed: its bookings go (after any clear in between)
			}
			switch b[1] >> 6 {
			case 1:
				clk.Add(11e9) // past the speculative TTL
				ix.Sweep()
			case 2:
				ix.Desync(w)
			case 3:
				ix.ResetRank(w, rank)
			}
			checkInvariants(t, ix)
		}
		for _, w := range []string{"a", "b"} {
			if _, ok := ix.Summary(w); !ok {
				t.Fatalf("summary of %s missing", w)
			}
		}
	})
}
