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
// for a full-attention model without multimodal inputs: an adapter's blocks carry
// lora_id, lora_name and the name as every block's first extra key, cache_salt follows
// on the first block (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys).
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
			if ev.LoRA != "" {
				id := loraID(ev.LoRA)
				w.LoRAID, w.LoRAName = &id, ev.LoRA
				for j := range w.ExtraKeys {
					w.ExtraKeys[j] = []any{ev.LoRA}
				}
			}
			if ev.CacheSalt != "" && len(ev.Hashes) > 0 {
				if ev.LoRA != "" {
					w.ExtraKeys[0] = []any{ev.LoRA, ev.CacheSalt}
				} else {
					w.ExtraKeys[0] = []any{ev.CacheSalt}
				}
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

// loraID is a stable positive id for an adapter name (vLLM numbers adapters as it
// registers them; the id only has to be consistent within a worker).
func loraID(name string) int64 {
	h := uint32(2166136261)
	for i := 0; i < len(name); i++ {
		h = (h ^ uint32(name[i])) * 16777619
	}
	return int64(h&0x7fffffff) + 1
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
