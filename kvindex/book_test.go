package kvindex

import (
	"testing"
	"time"
)

func heldBy(ms []Match, worker string) int {
	for _, m := range ms {
		if m.Worker == worker {
			return m.Blocks
		}
	}
	return 0
}

// Withdraw takes back exactly what its Book created: a prefix another request booked
// before, a key confirmed by an event since, and a key another request booked again
// later all stay.
func TestWithdrawRemovesOnlyWhatTheBookingCreated(t *testing.T) {
	ix, clk := newTestIndex(t)
	ix.SetWorker(WorkerInfo{Name: "a", Model: "m", Events: true})
	keys := keysOf("m", toks(0, 8))

	ix.Speculate("a", keys[:3]) // an earlier request's prefix
	clk.Add(time.Millisecond)
	b := ix.Book("a", keys)
	if b.Len() != 5 {
		t.Fatalf("booking created %d entries, want 5 (keys 3..7)", b.Len())
	}
	ix.Store("a", TierGPU, keys[5:6]) // an event confirms key 5
	clk.Add(time.Millisecond)
	ix.Speculate("a", keys[7:8]) // another request books key 7 again, later
	if got := heldBy(ix.Lookup(keys, nil), "a"); got != 8 {
		t.Fatalf("before withdraw: %d blocks, want 8", got)
	}
	entries := ix.Entries()
	if n := ix.Withdraw(b); n != 3 {
		t.Fatalf("withdrew %d entries, want 3 (keys 3, 4, 6; 5 is confirmed, 7 booked again)", n)
	}
	if got := ix.Entries(); got != entries-3 {
		t.Fatalf("entries %d after withdraw, want %d", got, entries-3)
	}
	if got := heldBy(ix.Lookup(keys, nil), "a"); got != 3 {
		t.Fatalf("after withdraw: %d blocks, want the earlier prefix of 3", got)
	}
	if got := heldBy(ix.Lookup(keys[5:], nil), "a"); got != 1 {
		t.Fatalf("confirmed key 5: %d blocks, want 1 (key 6 withdrawn)", got)
	}
	if got := heldBy(ix.Lookup(keys[7:], nil), "a"); got != 1 {
		t.Fatalf("re-booked key 7: %d blocks, want 1", got)
	}
	if n := ix.Withdraw(b); n != 0 {
		t.Fatalf("second withdraw removed %d, want 0", n)
	}
	s, _ := ix.Summary("a")
	if s.Speculative != 4 { // keys 0, 1, 2, 7
		t.Fatalf("live speculative entries %d, want 4", s.Speculative)
	}
	// The FIFO still expires what is left, and skips the withdrawn entries.
	clk.Add(11 * time.Second)
	ix.Sweep()
	if s, _ := ix.Summary("a"); s.Speculative != 0 {
		t.Fatalf("after TTL: %d speculative entries, want 0", s.Speculative)
	}
}

// A booking on a removed worker withdraws nothing and does not panic; the zero
// Booking is a no-op.
func TestWithdrawAfterRemoveWorker(t *testing.T) {
	ix, _ := newTestIndex(t)
	b := ix.Book("a", keysOf("m", toks(0, 4)))
	ix.RemoveWorker("a")
	if n := ix.Withdraw(b); n != 0 {
		t.Fatalf("withdrew %d from a removed worker", n)
	}
	if n := ix.Withdraw(Booking{}); n != 0 {
		t.Fatalf("zero booking withdrew %d", n)
	}
	if ix.Entries() != 0 {
		t.Fatalf("entries %d, want 0", ix.Entries())
	}
}

// TestRebookingKeepsOneFIFOEntry: booking the same blocks again (the next turn of a
// conversation books its whole prompt) refreshes their expiry without queueing them
// twice; a block booked again outlives its first booking's TTL and expires a TTL after
// its last booking.
func TestRebookingKeepsOneFIFOEntry(t *testing.T) {
	ix, c := newTestIndex(t)
	ix.SetWorker(WorkerInfo{Name: "a", Model: "m"})
	keys := keysOf("m", toks(1, 8))
	for range 5 {
		ix.Book("a", keys)
		c.Add(4 * time.Second)
	}
	// 20 s after the first booking (TTL 10 s), 4 s after the last.
	if n := ix.nFIFO.Load(); n != int64(len(keys)) {
		t.Fatalf("FIFO holds %d entries for %d booked blocks", n, len(keys))
	}
	if got := blocksOf(ix.Lookup(keys, nil)); got["a"] != len(keys) {
		t.Fatalf("blocks booked again 4 s ago expired: %v", got)
	}
	c.Add(7 * time.Second) // 11 s after the last booking
	ix.Book("a", keysOf("m", toks(100, 1)))
	if got := blocksOf(ix.Lookup(keys, nil)); got["a"] != 0 {
		t.Fatalf("blocks outlived their last booking's TTL: %v", got)
	}
	if n := ix.nFIFO.Load(); n != 1 {
		t.Fatalf("FIFO holds %d entries, want the one live booking", n)
	}
}

// TestBookKeyZero: key 0 (the empty-slot marker, stored as 1: rhKey) and key 1 are
// distinct keys sharing a slot chain; booking them, booking them again, and withdrawing
// one leaves each one's holder where it should be. Book finds keys by their mix
// computed once (locateMixed), which must take 0 to 1's chain as find does.
func TestBookKeyZero(t *testing.T) {
	ix, _ := newTestIndex(t)
	ix.SetWorker(WorkerInfo{Name: "a", Model: "m"})
	ix.SetWorker(WorkerInfo{Name: "b", Model: "m"})
	zero, one := []Key{0}, []Key{1}
	bz := ix.Book("a", zero)
	ix.Book("b", one)
	if bz.Len() != 1 || ix.Book("a", zero).Len() != 0 {
		t.Fatalf("booking key 0 again created an entry (first %d)", bz.Len())
	}
	if got := blocksOf(ix.Lookup(zero, nil)); got["a"] != 1 || got["b"] != 0 {
		t.Fatalf("key 0 held by %v, want a only", got)
	}
	if got := blocksOf(ix.Lookup(one, nil)); got["b"] != 1 || got["a"] != 0 {
		t.Fatalf("key 1 held by %v, want b only", got)
	}
	if n := ix.nFIFO.Load(); n != 2 {
		t.Fatalf("FIFO holds %d entries, want 2", n)
	}
}
