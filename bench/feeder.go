package bench

import (
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/sim"
)

// IndexFeeder applies one worker's KV event batch to kvroute's index. StoreFeeder does
// it through Index.Store/Remove; once kvindex decodes vLLM payloads itself
// (Index.ApplyPayload) a feeder that encodes with sim.MapEncoder can replace it.
type IndexFeeder interface {
	Apply(worker string, b sim.Batch)
}

// StoreFeeder maps engine hashes to kvroute keys per worker (ref-counted, as the same
// hash can be stored twice) and calls Store/Remove/RemoveWorker.
type StoreFeeder struct {
	Index *kvindex.Index
	Seed  kvindex.Key // namespace seed of the served model (kvindex.Namespace.Seed)
	m     map[string]map[uint64]keyRef
}

type keyRef struct {
	key kvindex.Key
	n   int
}

// Apply implements IndexFeeder.
func (f *StoreFeeder) Apply(worker string, b sim.Batch) {
	if f.m == nil {
		f.m = map[string]map[uint64]keyRef{}
	}
	wm := f.m[worker]
	if wm == nil {
		wm = map[uint64]keyRef{}
		f.m[worker] = wm
	}
	for _, ev := range b.Events {
		switch ev.Kind {
		case sim.BlockStored:
			parent := f.Seed
			if ev.HasParent {
				p, ok := wm[ev.Parent]
				if !ok {
					continue // parent unknown (evicted or missed): cannot key this chain
				}
				parent = p.key
			}
			keys := kvindex.HashBlocks(parent, ev.Tokens, ev.BlockSize, nil)
			for i, h := range ev.Hashes {
				if i >= len(keys) {
					break
				}
				r := wm[h]
				r.key = keys[i]
				r.n++
				wm[h] = r
			}
			f.Index.Store(worker, kvindex.TierGPU, keys)
		case sim.BlockRemoved:
			var gone []kvindex.Key
			for _, h := range ev.Hashes {
				r, ok := wm[h]
				if !ok {
					continue
				}
				if r.n--; r.n <= 0 {
					delete(wm, h)
					gone = append(gone, r.key)
				} else {
					wm[h] = r
				}
			}
			if len(gone) > 0 {
				f.Index.Remove(worker, gone)
			}
		case sim.AllBlocksCleared:
			clear(wm)
			f.Index.RemoveWorker(worker)
		}
	}
}
