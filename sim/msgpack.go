package sim

import (
	"encoding/binary"
	"math"
)

// Encoder turns one event batch into the msgpack payload frame vLLM publishes.
// Two formats exist (see ../shared/reference/vllm-kv-events.md): MapEncoder, vLLM ≥ 0.26
// (each event a map whose first key is "type"), and ArrayEncoder, older vLLM (each event
// a positional array). The kvindex package's wire encoder can replace these through
// this interface.
type Encoder interface {
	Encode(b Batch) []byte
}

// MapEncoder writes the vLLM ≥ 0.26 map format (msgspec omit_defaults: the sliding
// window field is left out).
type MapEncoder struct{}

// ArrayEncoder writes the legacy positional array format.
type ArrayEncoder struct{}

// Encode implements Encoder.
func (MapEncoder) Encode(b Batch) []byte { return encodeBatch(b, true) }

// Encode implements Encoder.
func (ArrayEncoder) Encode(b Batch) []byte { return encodeBatch(b, false) }

func encodeBatch(b Batch, maps bool) []byte {
	var w mpw
	w.arr(3)
	w.f64(b.TS)
	w.arr(len(b.Events))
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Kind {
		case BlockStored:
			if maps {
				w.mapHdr(11)
				w.str("type")
			} else {
				w.arr(11)
			}
			w.str("BlockStored")
			w.key(maps, "block_hashes")
			w.hashes(ev.Hashes)
			w.key(maps, "parent_block_hash")
			if ev.HasParent {
				w.u64full(ev.Parent)
			} else {
				w.nil()
			}
			w.key(maps, "token_ids")
			w.arr(len(ev.Tokens))
			for _, t := range ev.Tokens {
				w.uint(uint64(t))
			}
			w.key(maps, "block_size")
			w.uint(uint64(ev.BlockSize))
			w.key(maps, "lora_id")
			w.nil()
			w.key(maps, "medium")
			w.str(ev.Medium)
			w.key(maps, "lora_name")
			w.nil()
			w.key(maps, "extra_keys")
			w.arr(len(ev.Hashes))
			for j := range ev.Hashes {
				if j == 0 && ev.CacheSalt != "" {
					w.arr(1)
					w.str(ev.CacheSalt)
				} else {
					w.nil()
				}
			}
			w.key(maps, "group_idx")
			w.uint(0)
			w.key(maps, "kv_cache_spec_kind")
			w.str("full_attention")
		case BlockRemoved:
			if maps {
				w.mapHdr(4)
				w.str("type")
			} else {
				w.arr(4)
			}
			w.str("BlockRemoved")
			w.key(maps, "block_hashes")
			w.hashes(ev.Hashes)
			w.key(maps, "medium")
			w.str(ev.Medium)
			w.key(maps, "group_idx")
			w.uint(0)
		case AllBlocksCleared:
			if maps {
				w.mapHdr(1)
				w.str("type")
			} else {
				w.arr(1)
			}
			w.str("AllBlocksCleared")
		}
	}
	w.uint(uint64(b.DPRank))
	return w.b
}

// mpw is a minimal msgpack writer with the encodings msgspec produces.
type mpw struct{ b []byte }

func (w *mpw) key(maps bool, k string) {
	if maps {
		w.str(k)
	}
}

func (w *mpw) nil() { w.b = append(w.b, 0xc0) }

func (w *mpw) f64(f float64) {
	w.b = append(w.b, 0xcb)
	w.b = binary.BigEndian.AppendUint64(w.b, math.Float64bits(f))
}

func (w *mpw) arr(n int) {
	switch {
	case n < 16:
		w.b = append(w.b, 0x90|byte(n))
	case n < 1<<16:
		w.b = append(w.b, 0xdc)
		w.b = binary.BigEndian.AppendUint16(w.b, uint16(n))
	default:
		w.b = append(w.b, 0xdd)
		w.b = binary.BigEndian.AppendUint32(w.b, uint32(n))
	}
}

func (w *mpw) mapHdr(n int) {
	switch {
	case n < 16:
		w.b = append(w.b, 0x80|byte(n))
	case n < 1<<16:
		w.b = append(w.b, 0xde)
		w.b = binary.BigEndian.AppendUint16(w.b, uint16(n))
	default:
		w.b = append(w.b, 0xdf)
		w.b = binary.BigEndian.AppendUint32(w.b, uint32(n))
	}
}

func (w *mpw) str(s string) {
	switch n := len(s); {
	case n < 32:
		w.b = append(w.b, 0xa0|byte(n))
	case n < 1<<8:
		w.b = append(w.b, 0xd9, byte(n))
	case n < 1<<16:
		w.b = append(w.b, 0xda)
		w.b = binary.BigEndian.AppendUint16(w.b, uint16(n))
	default:
		w.b = append(w.b, 0xdb)
		w.b = binary.BigEndian.AppendUint32(w.b, uint32(n))
	}
	w.b = append(w.b, s...)
}

func (w *mpw) uint(v uint64) {
	switch {
	case v < 128:
		w.b = append(w.b, byte(v))
	case v < 1<<8:
		w.b = append(w.b, 0xcc, byte(v))
	case v < 1<<16:
		w.b = append(w.b, 0xcd)
		w.b = binary.BigEndian.AppendUint16(w.b, uint16(v))
	case v < 1<<32:
		w.b = append(w.b, 0xce)
		w.b = binary.BigEndian.AppendUint32(w.b, uint32(v))
	default:
		w.u64full(v)
	}
}

// u64full writes a block hash the way vLLM does: a uint64 in its minimal msgpack
// form (hashes are almost always ≥ 2^32, so 0xcf).
func (w *mpw) u64full(v uint64) {
	if v < 1<<32 {
		w.uint(v)
		return
	}
	w.b = append(w.b, 0xcf)
	w.b = binary.BigEndian.AppendUint64(w.b, v)
}

func (w *mpw) hashes(hs []uint64) {
	w.arr(len(hs))
	for _, h := range hs {
		w.u64full(h)
	}
}
