package kvevents

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Format is the event layout on the wire.
type Format uint8

const (
	// FormatMap: each event a map whose first key is "type" (vLLM ≥ 0.26, PR 42892).
	FormatMap Format = iota
	// FormatArray: each event a positional array, tag first (older vLLM).
	FormatArray
)

// EncodeOptions selects a wire version. The zero value is vLLM ≥ 0.26's: map events in
// a 3-element batch [ts, events, data_parallel_rank].
type EncodeOptions struct {
	Format Format
	// StoredLen is, for FormatArray, the BlockStored array length including the tag,
	// 6..12 (older versions had fewer fields). 0 means 11, or 12 when SlidingWindow is
	// set, as msgspec drops a trailing default.
	StoredLen int
	// RemovedLen is, for FormatArray, the BlockRemoved array length, 2..4. 0 means 4.
	RemovedLen int
	// BatchLen is 2 (no data-parallel rank, older vLLM) or 3. 0 means 3.
	BatchLen int
	// BatchMap writes the batch as a map {ts, events, data_parallel_rank}.
	BatchMap bool
}

// Encode returns b in vLLM ≥ 0.26's wire format (map events, 3-element batch).
func Encode(b *Batch) ([]byte, error) { return EncodeWith(b, EncodeOptions{}) }

// EncodeWith returns b in the wire version opt selects. Field encoding follows msgspec:
// the most compact integer forms, float64 ts, nil for absent optional values.
func EncodeWith(b *Batch, opt EncodeOptions) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	if err := encodeBatch(enc, b, opt); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func encodeBatch(enc *msgpack.Encoder, b *Batch, opt EncodeOptions) error {
	n := opt.BatchLen
	if n == 0 {
		n = 3
	}
	if n != 2 && n != 3 {
		return fmt.Errorf("kvevents: BatchLen %d, want 2 or 3", n)
	}
	rank := func() error {
		if !b.HasDPRank && b.DPRank == 0 {
			return enc.EncodeInt(0)
		}
		return enc.EncodeInt(int64(b.DPRank))
	}
	if opt.BatchMap {
		_ = enc.EncodeMapLen(n)
		_ = enc.EncodeString("ts")
		_ = enc.EncodeFloat64(b.TS)
		_ = enc.EncodeString("events")
		if err := encodeEvents(enc, b.Events, opt); err != nil {
			return err
		}
		if n == 3 {
			_ = enc.EncodeString("data_parallel_rank")
			return rank()
		}
		return nil
	}
	_ = enc.EncodeArrayLen(n)
	_ = enc.EncodeFloat64(b.TS)
	if err := encodeEvents(enc, b.Events, opt); err != nil {
		return err
	}
	if n == 3 {
		return rank()
	}
	return nil
}

func encodeEvents(enc *msgpack.Encoder, evs []Event, opt EncodeOptions) error {
	_ = enc.EncodeArrayLen(len(evs))
	for i := range evs {
		if err := encodeEvent(enc, &evs[i], opt); err != nil {
			return err
		}
	}
	return nil
}

func encodeHash(enc *msgpack.Encoder, h Hash) error {
	switch h.Form {
	case HashInt:
		return enc.EncodeInt(int64(h.ID))
	case HashBin:
		return enc.EncodeBytes(h.Bin)
	}
	return enc.EncodeUint(h.ID)
}

func optString(enc *msgpack.Encoder, s string) error {
	if s == "" {
		return enc.EncodeNil()
	}
	return enc.EncodeString(s)
}

func optInt(enc *msgpack.Encoder, p *int64) error {
	if p == nil {
		return enc.EncodeNil()
	}
	return enc.EncodeInt(*p)
}

// writeField writes the value of one named field of e.
func writeField(enc *msgpack.Encoder, e *Event, name string) error {
	switch name {
	case "block_hashes":
		_ = enc.EncodeArrayLen(len(e.BlockHashes))
		for _, h := range e.BlockHashes {
			if err := encodeHash(enc, h); err != nil {
				return err
			}
		}
		return nil
	case "parent_block_hash":
		if e.Parent == nil {
			return enc.EncodeNil()
		}
		return encodeHash(enc, *e.Parent)
	case "token_ids":
		_ = enc.EncodeArrayLen(len(e.TokenIDs))
		for _, t := range e.TokenIDs {
			_ = enc.EncodeUint(uint64(t))
		}
		return nil
	case "block_size":
		return enc.EncodeInt(int64(e.BlockSize))
	case "lora_id":
		return optInt(enc, e.LoRAID)
	case "medium":
		return optString(enc, e.Medium)
	case "lora_name":
		return optString(enc, e.LoRAName)
	case "extra_keys":
		if e.ExtraKeys == nil {
			return enc.EncodeNil()
		}
		_ = enc.EncodeArrayLen(len(e.ExtraKeys))
		for _, k := range e.ExtraKeys {
			if err := enc.Encode(k); err != nil {
				return err
			}
		}
		return nil
	case "group_idx":
		return enc.EncodeInt(int64(e.GroupIdx))
	case "kv_cache_spec_kind":
		return optString(enc, e.SpecKind)
	case "kv_cache_spec_sliding_window":
		return optInt(enc, e.SlidingWindow)
	}
	return fmt.Errorf("kvevents: unknown field %q", name)
}

func encodeEvent(enc *msgpack.Encoder, e *Event, opt EncodeOptions) error {
	var names []string
	switch e.Type {
	case TypeBlockStored:
		names = storedFields[:]
		if e.SlidingWindow == nil {
			names = names[:len(names)-1] // msgspec omits the None default
		}
		if opt.Format == FormatArray && opt.StoredLen != 0 {
			if opt.StoredLen < 6 || opt.StoredLen > 12 {
				return fmt.Errorf("kvevents: StoredLen %d, want 6..12", opt.StoredLen)
			}
			names = storedFields[:opt.StoredLen-1]
		}
	case TypeBlockRemoved:
		names = removedFields[:]
		if opt.Format == FormatArray && opt.RemovedLen != 0 {
			if opt.RemovedLen < 2 || opt.RemovedLen > 4 {
				return fmt.Errorf("kvevents: RemovedLen %d, want 2..4", opt.RemovedLen)
			}
			names = removedFields[:opt.RemovedLen-1]
		}
	case TypeAllBlocksCleared:
	default:
		return fmt.Errorf("kvevents: cannot encode event type %d", e.Type)
	}
	if opt.Format == FormatArray {
		_ = enc.EncodeArrayLen(1 + len(names))
	} else {
		_ = enc.EncodeMapLen(1 + len(names))
		_ = enc.EncodeString("type")
	}
	_ = enc.EncodeString(e.Type.String())
	for _, n := range names {
		if opt.Format == FormatMap {
			_ = enc.EncodeString(n)
		}
		if err := writeField(enc, e, n); err != nil {
			return err
		}
	}
	return nil
}
