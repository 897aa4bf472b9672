package bench

import (
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/sim"
)

// IndexFeeder applies one worker's KV event batch to kvroute's index. WireFeeder (the
// default) does it as in production: the batch is encoded as vLLM publishes it and
// decoded by kvindex; StoreFeeder keys blocks itself and calls Index.Store/Remove.
type IndexFeeder interface {
	Apply(worker string, b sim.Batch)
}

// WireFeeder encodes each engine's event batch with a vLLM wire encoder (sim.MapEncoder,
// vLLM ≥ 0.26's map-shaped events, unless Encoder is set) and hands the payload to
// Index.ApplyPayload, the path the ZMQ subscriber's frames take (decode, engine-hash
// table per DP rank, ref counts, parent resolution). Each worker is registered on its
// first batch as publishing events, in Model's namespace.
type WireFeeder struct {
	Index   *kvindex.Index
	Model   string      // served model: the namespace events are keyed in
	Encoder sim.Encoder // nil: sim.MapEncoder
	seen    map[string]bool
	// Errors counts payloads ApplyPayload rejected (none expected: a non-zero count
	// means the encoder and decoder disagree).
	Errors int
}

// Apply implements IndexFeeder.
func (f *WireFeeder) Apply(worker string, b sim.Batch) {
	if f.seen == nil {
		f.seen = map[string]bool{}
	}
	if !f.seen[worker] {
		f.seen[worker] = true
		f.Index.SetWorker(kvindex.WorkerInfo{Name: worker, Model: f.Model, Events: true})
	}
	enc := f.Encoder
	if enc == nil {
		enc = sim.MapEncoder{}
	}
	if err := f.Index.ApplyPayload(worker, b.DPRank, enc.Encode(b)); err != nil {
		f.Errors++
	}
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

// NewStoreFeeder is a VirtualOptions.NewFeeder that selects StoreFeeder.
func NewStoreFeeder(ix *kvindex.Index, seed kvindex.Key) IndexFeeder {
	return &StoreFeeder{Index: ix, Seed: seed}
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
