// Package kvevents is vLLM's KV-cache event wire format: the msgpack payload of one
// ZMQ message (an EventBatch), decoded from every version vLLM has shipped and encoded
// back, byte for byte, in the current one (or a legacy one, for tests and simulators).
//
// Sources: vllm/distributed/kv_events.py (EventBatch, KVCacheEvent, BlockStored,
// BlockRemoved, AllBlocksCleared; msgspec structs, tagged, map or array_like by
// version) and vllm/v1/core/block_pool.py (when each event fires). The golden payloads
// of vLLM's KV event format (vllm/distributed/kv_events.py) are decoded and re-encoded by the tests.
package kvevents

import (
	"errors"

	"github.com/cespare/xxhash/v2"
)

// ErrMalformed is returned (wrapped) for a payload that is not a vLLM event batch: bad
// msgpack, wrong shapes, or inconsistent fields (token count ≠ blocks × block_size).
var ErrMalformed = errors.New("kvevents: malformed payload")

// Type is an event's kind (its msgspec tag).
type Type uint8

const (
	TypeUnknown          Type = iota // a tag this package does not know; ignored by consumers
	TypeBlockStored                  // full blocks entered the prefix cache
	TypeBlockRemoved                 // blocks evicted from the prefix cache
	TypeAllBlocksCleared             // prefix cache reset (sleep, weight update, /reset_prefix_cache)
)

var typeNames = [...]string{"Unknown", "BlockStored", "BlockRemoved", "AllBlocksCleared"}

func (t Type) String() string {
	if int(t) < len(typeNames) {
		return typeNames[t]
	}
	return "Unknown"
}

// HashForm is how a block hash was (or will be) written on the wire.
type HashForm uint8

const (
	HashUint HashForm = iota // uint64 (default since vLLM 0.10.2: low 8 bytes of the digest)
	HashInt                  // signed int64 (vLLM ≤ 0.10.1 Python hash(); may be negative)
	HashBin                  // 32-byte bin (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)
)

// Hash is one engine block hash. Engine hashes are opaque to kvroute: they identify a
// block inside one engine process only, and serve to resolve parents and removals.
type Hash struct {
	// ID is the hash as a 64-bit identifier: the integer forms' value (negative int64
	// as two's complement), or xxhash64 of the bytes of a bin hash.
	ID   uint64
	Form HashForm
	Bin  []byte // the bytes of a HashBin hash; nil otherwise
}

// Uint returns a uint64-form hash.
func Uint(v uint64) Hash { return Hash{ID: v} }

// Int returns a signed int64-form hash (legacy vLLM).
func Int(v int64) Hash { return Hash{ID: uint64(v), Form: HashInt} }

// Bin returns a bin-form hash of b (32 bytes in vLLM).
func Bin(b []byte) Hash { return Hash{ID: xxhash.Sum64(b), Form: HashBin, Bin: b} }

// Event is one KV cache event. Fields that an event type does not carry stay zero.
type Event struct {
	Type        Type
	BlockHashes []Hash // BlockStored, BlockRemoved
	// Parent is the hash of the block before BlockHashes[0]; nil at the start of a
	// sequence. BlockStored only.
	Parent    *Hash
	TokenIDs  []uint32 // every token of the stored blocks, len = len(BlockHashes) × BlockSize
	BlockSize int      // tokens per block
	LoRAID    *int64   // nil when the request had no LoRA adapter
	Medium    string   // "GPU", "CPU", …; "" when absent or nil (then GPU)
	LoRAName  string   // LoRA adapter name, "" for none
	// ExtraKeys has one entry per stored block (nil when absent): that block's extra
	// hash keys as decoded msgpack values (LoRA name, multimodal hashes, cache_salt on
	// a sequence's first block, prompt-embeds hashes), or nil for a block without any.
	ExtraKeys     []any
	GroupIdx      int    // KV cache group (hybrid models); 0 when absent
	SpecKind      string // kv_cache_spec_kind, e.g. "full_attention"; "" when absent
	SlidingWindow *int64 // kv_cache_spec_sliding_window; nil when absent
	// Err is set (wrapping ErrMalformed) on a well-formed event whose fields disagree
	// (token count ≠ blocks × block_size, extra_keys count ≠ blocks, block_size ≤ 0).
	// Consumers skip and count such an event and apply the rest of the batch; the kind
	// filter comes first (an event of a group that is not indexed is skipped either way).
	Err error
}

// Batch is one ZMQ message's payload.
type Batch struct {
	TS     float64 // publisher's wall clock at batch creation, seconds since the epoch
	Events []Event
	// DPRank is the data-parallel rank that published the batch; HasDPRank is false
	// for 2-element batches (older vLLM) and for a nil rank.
	DPRank    int
	HasDPRank bool
	// Unknown counts events with a tag this package does not know (a newer vLLM's):
	// decoded to be skipped, never kept in Events.
	Unknown int
}
