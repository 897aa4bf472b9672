package kvindex

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/kvindex/kvevents"
	"github.com/kvroute/kvroute/metrics"
)

// Issue 11 item 4: a BlockStored whose token count does not match its block hashes is
// dropped and counted alone; the valid events beside it are applied. The kind filter
// runs first: a malformed event of a group that is not indexed is skipped, not "bad".
func TestBadEventDropsOnlyItself(t *testing.T) {
	ms := metrics.NewUnregistered().Index
	ix, _ := newTestIndex(t, func(o *Options) { o.Metrics = ms })
	addWorkers(ix, "a")
	tk, tk2 := toks(1, 2), toks(100, 1)
	bad := stored([]uint64{1, 2}, nil, tk[:7]) // 7 tokens for 2 blocks of 4
	badSW := stored([]uint64{7}, nil, tk[:3])  // inconsistent too, but its group is not indexed
	badSW.SpecKind, badSW.GroupIdx = "sliding_window", 1
	apply(t, ix, "a", 0, bad, stored([]uint64{5}, nil, tk2), badSW)
	if got := blocksOf(ix.Lookup(keysOf("m", tk2), nil)); got["a"] != 1 {
		t.Fatalf("valid event beside a bad one: %v, want a:1", got)
	}
	if got := ix.Lookup(keysOf("m", tk), nil); len(got) != 0 {
		t.Fatalf("bad event applied: %v", got)
	}
	if n := testutil.ToFloat64(ms.Anomalies.WithLabelValues("a", "bad_event")); n != 1 {
		t.Fatalf("bad_event %v, want 1", n)
	}
	if n := testutil.ToFloat64(ms.Events.WithLabelValues("a", "skipped")); n != 1 {
		t.Fatalf("skipped %v, want 1 (kind filter before the consistency check)", n)
	}
	if n := testutil.ToFloat64(ms.DecodeErrors.WithLabelValues("a")); n != 0 {
		t.Fatalf("decode errors %v, want 0", n)
	}
}

// Unknown event kinds are counted as events of type Unknown.
func TestUnknownEventsCounted(t *testing.T) {
	ms := metrics.NewUnregistered().Index
	ix, _ := newTestIndex(t, func(o *Options) { o.Metrics = ms })
	addWorkers(ix, "a")
	if err := ix.ApplyBatch("a", 0, &kvevents.Batch{TS: 1, Unknown: 2}); err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(ms.Events.WithLabelValues("a", "Unknown")); n != 2 {
		t.Fatalf("Unknown %v, want 2", n)
	}
}

// Issue 11 item 8: AllBlocksCleared also drops the worker's speculative entries (the
// router's bookings), which otherwise counted as cached until their TTL.
func TestAllBlocksClearedDropsSpeculative(t *testing.T) {
	ix, _ := newTestIndex(t)
	addWorkers(ix, "a", "b")
	k := keysOf("m", toks(1, 3))
	ix.Speculate("a", k)
	ix.Speculate("b", k)
	if got := blocksOf(ix.Lookup(k, nil)); got["a"] != 3 || got["b"] != 3 {
		t.Fatalf("speculated %v", got)
	}
	apply(t, ix, "a", 0, kvevents.Event{Type: kvevents.TypeAllBlocksCleared})
	if got := blocksOf(ix.Lookup(k, nil)); got["a"] != 0 || got["b"] != 3 {
		t.Fatalf("after a's AllBlocksCleared: %v, want a:0 b:3", got)
	}
	if s, _ := ix.Summary("a"); s.Speculative != 0 {
		t.Fatalf("speculative entries left: %d", s.Speculative)
	}
}
