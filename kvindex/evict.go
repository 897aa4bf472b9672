package kvindex

import (
	"sort"
)

// Bytes per structure, measured with runtime.MemStats in TestBytesPerEntry (Go 1.26
// swiss maps at their average load; see BENCHMARKS.md "KV index"):
const (
	bytesPerKey    = 20 // shard table slot: key (8) + holder (8) at ~0.8 average load
	bytesPerShared = 20 // a holder in an overflow list (8, plus slice growth) and the list's share of its header
	bytesPerEng    = 25 // rank table slot: engine hash (8) + key (8) + refs/gen (4) at ~0.8 average load
	bytesPerFIFO   = 16 // speculative FIFO entry
	evictBatch     = 64 // victims per memory-eviction round
	evictSample    = 32 // engine entries sampled per round
	maxEvictRounds = 64 // bound on rounds per write, so one write never stalls long
)

// Bytes is the index's estimated memory: counts of each structure times its measured
// size.
func (ix *Index) Bytes() int64 {
	shared := ix.nHolders.Load() - ix.nKeys.Load() // holders beyond the first of their key
	return ix.nKeys.Load()*bytesPerKey + shared*bytesPerShared + ix.nEng.Load()*bytesPerEng + ix.nFIFO.Load()*bytesPerFIFO
}

// Entries is the number of (block, worker) entries: confirmed and speculative holders.
func (ix *Index) Entries() int64 { return ix.nHolders.Load() }

// Keys is the number of distinct block keys.
func (ix *Index) Keys() int64 { return ix.nKeys.Load() }

func (ix *Index) updateGauges() {
	ix.m.Entries.Set(float64(ix.nHolders.Load()))
	ix.m.Keys.Set(float64(ix.nKeys.Load()))
	ix.m.Bytes.Set(float64(ix.Bytes()))
}

// afterWrite enforces the memory cap (outside every worker lock) and updates gauges.
func (ix *Index) afterWrite() {
	if ix.opt.MaxBytes > 0 && ix.Bytes() > ix.opt.MaxBytes {
		ix.evictMemory()
	}
	ix.updateGauges()
}

// evictMemory evicts until the estimate is at most 95% of MaxBytes (or the round bound
// is hit). Victims come from the worker holding the most entries: its oldest
// speculative entries when they outnumber its confirmed ones, else the least recently
// stored or used of a random sample of its engine entries (sampled LRU, as Redis does:
// no per-entry list to maintain). An evicted confirmed block's later BlockRemoved is
// counted as unknown_removed; a child stored under it as unknown_parent.
func (ix *Index) evictMemory() {
	target := ix.opt.MaxBytes / 100 * 95
	for round := 0; round < maxEvictRounds && ix.Bytes() > target; round++ {
		w := ix.largestWorker()
		if w == nil {
			return
		}
		w.mu.Lock()
		n := 0
		if w.specLive > w.nEng {
			n = ix.evictSpecLocked(w, evictBatch)
		} else {
			n = ix.evictEngLocked(w, evictBatch)
		}
		w.mu.Unlock()
		if n == 0 {
			return
		}
		ix.m.Evictions.WithLabelValues("memory").Add(float64(n))
	}
}

func (ix *Index) largestWorker() *worker {
	ix.wmu.Lock()
	defer ix.wmu.Unlock()
	var best *worker
	bestN := 0
	for _, w := range ix.byID {
		if w == nil {
			continue
		}
		// Unsynchronized read of sizes is a heuristic only; take the lock to be exact.
		w.mu.Lock()
		n := w.nEng + w.specLive
		w.mu.Unlock()
		if n > bestN {
			best, bestN = w, n
		}
	}
	return best
}

func (ix *Index) evictSpecLocked(w *worker, n int) int {
	done := 0
	for done < n && len(w.fifo) > 0 {
		s := w.fifo[0]
		w.fifo = w.fifo[1:]
		ix.nFIFO.Add(-1)
		// A holder booked again after s was queued has no other entry: it goes too.
		_, after, existed := ix.update(s.key, w.id, nil, func(h *holder) bool { return !h.spec() })
		if existed && after.wf == 0 {
			w.specLive--
			done++
		}
	}
	return done
}

func (ix *Index) evictEngLocked(w *worker, n int) int {
	type cand struct {
		r     *rank
		eh    uint64
		e     engEntry
		stamp uint32
	}
	var cs []cand
	for _, r := range w.ranks {
		if r.t.Cap() == 0 {
			continue
		}
		start := int(ix.evictCursor.Add(0x9E3779B9) % uint32(r.t.Cap())) // a new region each round
		for _, it := range r.items(start, evictSample*4) {
			h, _ := ix.peek(it.e.key, w.id)
			cs = append(cs, cand{r, it.eh, it.e, h.stamp})
		}
	}
	now := ix.tick()
	sort.Slice(cs, func(i, j int) bool { return after(now-cs[i].stamp, now-cs[j].stamp) }) // oldest first
	done := 0
	for _, c := range cs {
		if done >= n || done >= len(cs)/2+1 {
			break
		}
		ix.releaseLocked(w, c.r, c.eh, c.e)
		done++
	}
	return done
}

// Sweep removes expired speculative entries of every worker. The subscriber manager
// calls it periodically; Speculate also expires the picked worker's entries.
func (ix *Index) Sweep() {
	ix.wmu.Lock()
	ws := make([]*worker, 0, len(ix.byName))
	for _, w := range ix.byID {
		if w != nil {
			ws = append(ws, w)
		}
	}
	ix.wmu.Unlock()
	now := ix.tick()
	for _, w := range ws {
		w.mu.Lock()
		ix.expireLocked(w, now)
		ix.m.WorkerEntries.WithLabelValues(w.name).Set(float64(w.nEng + w.specLive))
		w.mu.Unlock()
	}
	ix.updateGauges()
}
