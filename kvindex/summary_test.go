package kvindex

import (
	"runtime"
	"testing"
)

// tierCounts recomputes a worker's per-tier engine entry counts by walking every entry
// (what Summary used to do under the worker's lock).
func tierCounts(ix *Index, name string) (byTier [NumTiers]int, eng int) {
	w := ix.worker(name)
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range w.ranks {
		for _, it := range r.items(0, -1) {
			eng++
			for t := Tier(0); t < NumTiers; t++ {
				if it.e.refs[t] > 0 {
					byTier[t]++
				}
			}
		}
	}
	return byTier, eng
}

// Issue 10 item 3: /debug/index summarised a worker by walking every entry under the
// worker's lock, which Pick (Speculate) and event application need. Summary now copies
// counters: what it allocates (and so the work under the lock) does not grow with the
// worker's entries, and its per-tier counts equal a full walk.
func TestSummaryCopiesBoundedState(t *testing.T) {
	ix, _ := newTestIndex(t)
	addWorkers(ix, "a")
	keys := keysOf("m", toks(1, 100_000))
	ix.Store("a", TierGPU, keys)
	ix.Store("a", TierCPU, keys[:30_000])
	ix.Remove("a", keys[90_000:])
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	s, ok := ix.Summary("a")
	runtime.ReadMemStats(&b)
	if !ok {
		t.Fatal("no summary")
	}
	if n := b.TotalAlloc - a.TotalAlloc; n > 16<<10 {
		t.Fatalf("Summary of a 90k-entry worker allocated %d bytes: it walks the entries under the worker's lock", n)
	}
	want, eng := tierCounts(ix, "a")
	if s.EngineEntries != eng || s.ByTier["GPU"] != want[TierGPU] || s.ByTier["CPU"] != want[TierCPU] || want[TierGPU] != 90_000 || want[TierCPU] != 30_000 {
		t.Fatalf("summary %d entries %v, walk %d entries %v", s.EngineEntries, s.ByTier, eng, want)
	}
}
