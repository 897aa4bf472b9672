package sim

// EventKind is the type of a KV cache event (vllm/distributed/kv_events.py).
type EventKind uint8

const (
	BlockStored      EventKind = iota + 1 // full blocks entered the prefix cache
	BlockRemoved                          // blocks evicted from the prefix cache
	AllBlocksCleared                      // the prefix cache was reset
)

func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "Unknown"
}

// Event is one KV cache event as vLLM emits it.
type Event struct {
	Kind      EventKind
	Hashes    []uint64 // engine block hashes (BlockStored, BlockRemoved)
	HasParent bool     // BlockStored: parent_block_hash is set (false → nil, first block of a chain)
	Parent    uint64   // BlockStored: engine hash of the block before Hashes[0]
	Tokens    []uint32 // BlockStored: token ids of all blocks, len = len(Hashes) × BlockSize
	BlockSize int      // BlockStored
	CacheSalt string   // BlockStored: cache_salt, sent as the first block's extra key; "" none
	LoRA      string   // BlockStored: the request's LoRA adapter (lora_name, every block's first extra key); "" none
	Medium    string   // "GPU"
}

// Batch is the events of one engine step, published as one message
// (vLLM KVEventBatch: [ts, events, data_parallel_rank]).
type Batch struct {
	TS     float64 // seconds since the Unix epoch (virtual seconds in virtual time)
	Events []Event
	DPRank int
}
