package sim

import (
	"github.com/kvroute/kvroute/kvindex/kvevents"
)

// Encoder turns one event batch into the msgpack payload frame vLLM publishes.
// Two formats exist (vLLM vllm/distributed/kv_events.py): MapEncoder, vLLM ≥ 0.26
// (each event a map whose first key is "type"), and ArrayEncoder, older vLLM (each event
// a positional array). Both delegate to package kvevents, kvroute's one wire encoder, so
// the simulator publishes exactly the bytes kvroute's decoder is tested against.
type Encoder interface {
	Encode(b Batch) []byte
}

// MapEncoder writes the vLLM ≥ 0.26 map format (msgspec omit_defaults: the sliding
// window field is left out).
type MapEncoder struct{}

// ArrayEncoder writes the legacy positional array format.
type ArrayEncoder struct{}

// Encode implements Encoder.
func (MapEncoder) Encode(b Batch) []byte { return encode(b, kvevents.FormatMap) }

// Encode implements Encoder.
func (ArrayEncoder) Encode(b Batch) []byte { return encode(b, kvevents.FormatArray) }

// WireBatch converts a simulated engine batch into the wire model: the fields vLLM sets
// for a plain (no LoRA, no multimodal) full-attention model, with cache_salt as the first
// block's extra key (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys).
func WireBatch(b Batch) *kvevents.Batch {
	out := &kvevents.Batch{TS: b.TS, DPRank: b.DPRank, HasDPRank: true, Events: make([]kvevents.Event, len(b.Events))}
	for i := range b.Events {
		ev := &b.Events[i]
		w := &out.Events[i]
		switch ev.Kind {
		case BlockStored:
			w.Type = kvevents.TypeBlockStored
			w.BlockHashes = wireHashes(ev.Hashes)
			if ev.HasParent {
				p := kvevents.Uint(ev.Parent)
				w.Parent = &p
			}
			w.TokenIDs, w.BlockSize, w.Medium = ev.Tokens, ev.BlockSize, ev.Medium
			w.ExtraKeys = make([]any, len(ev.Hashes))
			if ev.CacheSalt != "" && len(ev.Hashes) > 0 {
				w.ExtraKeys[0] = []any{ev.CacheSalt}
			}
			w.SpecKind = "full_attention"
		case BlockRemoved:
			w.Type = kvevents.TypeBlockRemoved
			w.BlockHashes = wireHashes(ev.Hashes)
			w.Medium = ev.Medium
		case AllBlocksCleared:
			w.Type = kvevents.TypeAllBlocksCleared
		}
	}
	return out
}

func wireHashes(hs []uint64) []kvevents.Hash {
	out := make([]kvevents.Hash, len(hs))
	for i, h := range hs {
		out[i] = kvevents.Uint(h)
	}
	return out
}

func encode(b Batch, f kvevents.Format) []byte {
	p, err := kvevents.EncodeWith(WireBatch(b), kvevents.EncodeOptions{Format: f})
	if err != nil {
		// EncodeWith fails only on values msgpack cannot represent or on a writer error;
		// a WireBatch holds floats, ints, strings and slices of them written to memory,
		// so an error here is a programming error, not bad input.
		panic("sim: encoding a KV event batch: " + err.Error())
	}
	return p
}
