package kvevents

import (
	"bytes"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Decoder decodes event batches, reusing its buffers between calls. Not safe for
// concurrent use; the zero value is not ready, use NewDecoder.
type Decoder struct {
	rd  bytes.Reader
	dec *msgpack.Decoder
}

// NewDecoder returns a Decoder.
func NewDecoder() *Decoder {
	d := &Decoder{}
	d.dec = msgpack.NewDecoder(&d.rd)
	return d
}

// Decode decodes one payload into a fresh Batch. Every error wraps ErrMalformed.
func Decode(payload []byte) (*Batch, error) {
	var b Batch
	if err := NewDecoder().Decode(payload, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// Decode decodes payload into b, overwriting it. The whole payload is decoded and
// checked before Decode returns, so a caller that applies b only on a nil error never
// applies half a batch. Accepted shapes:
//   - batch: array [ts, events] or [ts, events, data_parallel_rank], or a map with keys
//     ts, events, data_parallel_rank (unknown keys ignored);
//   - event: a map with a "type" key (vLLM ≥ 0.26) or a positional array whose first
//     element is the tag (older vLLM; trailing defaults may be missing);
//   - hash: uint64, int64 or bin.
//
// Every error wraps ErrMalformed.
func (d *Decoder) Decode(payload []byte, b *Batch) error {
	*b = Batch{Events: b.Events[:0]}
	// Every declared length is checked against the bytes that follow before anything
	// is allocated from it (the msgpack library allocates declared lengths as given).
	if err := checkShape(payload); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	d.rd.Reset(payload)
	d.dec.Reset(&d.rd)
	if err := d.batch(b); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if d.rd.Len() != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrMalformed, d.rd.Len())
	}
	return nil
}

func (d *Decoder) batch(b *Batch) error {
	c, err := d.dec.PeekCode()
	if err != nil {
		return err
	}
	if msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32 {
		n, err := d.dec.DecodeMapLen()
		if err != nil {
			return err
		}
		seen := false
		for i := 0; i < n; i++ {
			k, err := d.dec.DecodeString()
			if err != nil {
				return fmt.Errorf("batch key: %v", err)
			}
			switch k {
			case "ts":
				b.TS, err = d.float()
			case "events":
				seen = true
				err = d.events(b)
			case "data_parallel_rank":
				err = d.rank(b)
			default:
				err = d.dec.Skip()
			}
			if err != nil {
				return fmt.Errorf("batch %s: %v", k, err)
			}
		}
		if !seen {
			return fmt.Errorf("batch map without events")
		}
		return nil
	}
	n, err := d.dec.DecodeArrayLen()
	if err != nil {
		return fmt.Errorf("batch: %v", err)
	}
	if n < 2 || n > 3 {
		return fmt.Errorf("batch: array of %d elements, want 2 or 3", n)
	}
	if b.TS, err = d.float(); err != nil {
		return fmt.Errorf("batch ts: %v", err)
	}
	if err := d.events(b); err != nil {
		return err
	}
	if n == 3 {
		return d.rank(b)
	}
	return nil
}

func (d *Decoder) rank(b *Batch) error {
	if d.isNil() {
		return d.dec.DecodeNil()
	}
	r, err := d.dec.DecodeInt64()
	if err != nil || r < 0 || r > math.MaxInt32 {
		return fmt.Errorf("data_parallel_rank: %v (%d)", err, r)
	}
	b.DPRank, b.HasDPRank = int(r), true
	return nil
}

func (d *Decoder) float() (float64, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Float || c == msgpcode.Double {
		return d.dec.DecodeFloat64()
	}
	if c == msgpcode.Nil {
		return 0, fmt.Errorf("nil timestamp")
	}
	v, err := d.dec.DecodeInt64() // an integral ts is still a time
	return float64(v), err
}

func (d *Decoder) isNil() bool {
	c, err := d.dec.PeekCode()
	return err == nil && c == msgpcode.Nil
}

func (d *Decoder) events(b *Batch) error {
	n, err := d.dec.DecodeArrayLen()
	if err != nil || n < 0 {
		return fmt.Errorf("events: not an array (%v)", err)
	}
	// n is bounded by the payload (checkShape), but an event takes far more memory
	// than its smallest encoding: grow with the events actually decoded.
	if cap(b.Events) < min(n, initialCap) {
		b.Events = make([]Event, 0, min(n, initialCap))
	}
	for i := 0; i < n; i++ {
		b.Events = append(b.Events, Event{})
		e := &b.Events[len(b.Events)-1]
		if err := d.event(e); err != nil {
			return fmt.Errorf("event %d: %v", i, err)
		}
		if e.Type == TypeUnknown { // counted, not kept: nothing to apply
			b.Unknown++
			b.Events = b.Events[:len(b.Events)-1]
			continue
		}
		if err := e.check(); err != nil {
			// A well-formed event whose fields disagree: only this event is dropped
			// (consumers skip events with Err set, after their kind filter).
			e.Err = fmt.Errorf("%w: event %d (%s): %v", ErrMalformed, i, e.Type, err)
		}
	}
	return nil
}

// initialCap bounds the capacity preallocated from a declared element count; slices
// grow beyond it with the elements actually decoded.
const initialCap = 64

func (e *Event) check() error {
	if e.Type != TypeBlockStored {
		return nil
	}
	if e.BlockSize <= 0 {
		return fmt.Errorf("block_size %d", e.BlockSize)
	}
	if len(e.TokenIDs) != len(e.BlockHashes)*e.BlockSize {
		return fmt.Errorf("%d token ids for %d blocks of %d", len(e.TokenIDs), len(e.BlockHashes), e.BlockSize)
	}
	if e.ExtraKeys != nil && len(e.ExtraKeys) != len(e.BlockHashes) {
		return fmt.Errorf("%d extra_keys for %d blocks", len(e.ExtraKeys), len(e.BlockHashes))
	}
	return nil
}

func parseType(s string) Type {
	switch s {
	case "BlockStored":
		return TypeBlockStored
	case "BlockRemoved":
		return TypeBlockRemoved
	case "AllBlocksCleared":
		return TypeAllBlocksCleared
	}
	return TypeUnknown
}

func (d *Decoder) event(e *Event) error {
	c, err := d.dec.PeekCode()
	if err != nil {
		return err
	}
	if msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32 {
		return d.eventMap(e)
	}
	return d.eventArray(e)
}

// fields in positional order, after the tag (vllm/distributed/kv_events.py).
var storedFields = [...]string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
	"medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
var removedFields = [...]string{"block_hashes", "medium", "group_idx"}

func (d *Decoder) eventArray(e *Event) error {
	n, err := d.dec.DecodeArrayLen()
	if err != nil || n < 1 {
		return fmt.Errorf("event: not a map or a tagged array (%v)", err)
	}
	tag, err := d.dec.DecodeString()
	if err != nil {
		return fmt.Errorf("event tag: %v", err)
	}
	e.Type = parseType(tag)
	var names []string
	switch e.Type {
	case TypeBlockStored:
		names = storedFields[:]
		if n < 6 { // tag, hashes, parent, tokens, block_size, lora_id: the oldest layout
			return fmt.Errorf("BlockStored array of %d elements, want ≥ 6", n)
		}
	case TypeBlockRemoved:
		names = removedFields[:]
		if n < 2 {
			return fmt.Errorf("BlockRemoved array of %d elements, want ≥ 2", n)
		}
	}
	for i := 1; i < n; i++ {
		if i-1 < len(names) {
			if err := d.field(e, names[i-1]); err != nil {
				return fmt.Errorf("%s: %v", names[i-1], err)
			}
			continue
		}
		if err := d.dec.Skip(); err != nil {
			return err
		}
	}
	return nil
}

func (d *Decoder) eventMap(e *Event) error {
	n, err := d.dec.DecodeMapLen()
	if err != nil {
		return err
	}
	typed := false
	for i := 0; i < n; i++ {
		k, err := d.dec.DecodeString()
		if err != nil {
			return fmt.Errorf("event key: %v", err)
		}
		if k == "type" {
			s, err := d.dec.DecodeString()
			if err != nil {
				return fmt.Errorf("type: %v", err)
			}
			e.Type, typed = parseType(s), true
			continue
		}
		if err := d.field(e, k); err != nil {
			return fmt.Errorf("%s: %v", k, err)
		}
	}
	if !typed {
		return fmt.Errorf("event map without type")
	}
	return nil
}

// field decodes the value of one named field into e; unknown names are skipped.
func (d *Decoder) field(e *Event, name string) error {
	var err error
	switch name {
	case "block_hashes":
		var n int
		if n, err = d.dec.DecodeArrayLen(); err != nil || n < 0 {
			return fmt.Errorf("not an array (%v)", err)
		}
		e.BlockHashes = make([]Hash, 0, min(n, initialCap))
		for range n {
			var h *Hash
			if h, err = d.hash(); err != nil {
				return err
			}
			if h == nil {
				return fmt.Errorf("nil block hash")
			}
			e.BlockHashes = append(e.BlockHashes, *h)
		}
	case "parent_block_hash":
		// An integer parent of 0 means "no parent": llm-d-inference-sim writes 0, not
		// nil, at the start of a sequence in its positional-array format.
		if e.Parent, err = d.hash(); err == nil && e.Parent != nil && e.Parent.Form != HashBin && e.Parent.ID == 0 {
			e.Parent = nil
		}
	case "token_ids":
		var n int
		if n, err = d.dec.DecodeArrayLen(); err != nil || n < 0 {
			return fmt.Errorf("not an array (%v)", err)
		}
		e.TokenIDs = make([]uint32, n) // 4 bytes each for ≥ 1 byte on the wire (checkShape)
		for i := range e.TokenIDs {
			var v int64
			if v, err = d.dec.DecodeInt64(); err != nil {
				return err
			}
			if v < 0 || v > math.MaxUint32 {
				return fmt.Errorf("token id %d out of range", v)
			}
			e.TokenIDs[i] = uint32(v)
		}
	case "block_size":
		var v int64
		v, err = d.dec.DecodeInt64()
		if err == nil && (v < 0 || v > 1<<20) {
			err = fmt.Errorf("%d out of range", v)
		}
		e.BlockSize = int(v)
	case "lora_id":
		if d.isNil() {
			return d.dec.DecodeNil()
		}
		var v int64
		v, err = d.dec.DecodeInt64()
		e.LoRAID = &v
	case "medium":
		e.Medium, err = d.optString()
	case "lora_name":
		e.LoRAName, err = d.optString()
	case "extra_keys":
		if d.isNil() {
			return d.dec.DecodeNil()
		}
		var n int
		if n, err = d.dec.DecodeArrayLen(); err != nil || n < 0 {
			return fmt.Errorf("not an array (%v)", err)
		}
		e.ExtraKeys = make([]any, n)
		for i := range e.ExtraKeys {
			if e.ExtraKeys[i], err = d.dec.DecodeInterface(); err != nil {
				return err
			}
		}
	case "group_idx":
		if d.isNil() {
			return d.dec.DecodeNil()
		}
		var v int64
		v, err = d.dec.DecodeInt64()
		if err == nil && (v < 0 || v > math.MaxInt32) {
			err = fmt.Errorf("%d out of range", v)
		}
		e.GroupIdx = int(v)
	case "kv_cache_spec_kind":
		e.SpecKind, err = d.optString()
	case "kv_cache_spec_sliding_window":
		if d.isNil() {
			return d.dec.DecodeNil()
		}
		var v int64
		v, err = d.dec.DecodeInt64()
		e.SlidingWindow = &v
	default:
		err = d.dec.Skip()
	}
	return err
}

func (d *Decoder) optString() (string, error) {
	if d.isNil() {
		return "", d.dec.DecodeNil()
	}
	return d.dec.DecodeString()
}

// hash decodes a block hash in any of its three forms, or nil.
func (d *Decoder) hash() (*Hash, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case c == msgpcode.Nil:
		return nil, d.dec.DecodeNil()
	case msgpcode.IsBin(c) || msgpcode.IsString(c):
		b, err := d.dec.DecodeBytes()
		if err != nil {
			return nil, err
		}
		h := Bin(b)
		return &h, nil
	case c <= msgpcode.PosFixedNumHigh || (c >= msgpcode.Uint8 && c <= msgpcode.Uint64):
		v, err := d.dec.DecodeUint64()
		if err != nil {
			return nil, err
		}
		h := Uint(v)
		return &h, nil
	case msgpcode.IsFixedNum(c) || (c >= msgpcode.Int8 && c <= msgpcode.Int64):
		v, err := d.dec.DecodeInt64()
		if err != nil {
			return nil, err
		}
		h := Int(v)
		return &h, nil
	}
	return nil, fmt.Errorf("block hash: unexpected msgpack code %#x", c)
}
