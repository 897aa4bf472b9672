package kvindex

import (
	"testing"

	"github.com/kvroute/kvroute/kvindex/kvevents"
)

// vLLM keys a LoRA request's blocks with the adapter first in every block's extra keys
// (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys: lora keys + mm keys +
// cache_salt on the first block); the router keys the request in the adapter's
// namespace (router: Namespace{Model: base, LoRA: adapter name}). These cases follow
// the event shapes of three vLLM generations.
func TestLoRABlocksMatchAdapterRequests(t *testing.T) {
	adapterKeys := func(tk []uint32, salt string) []Key {
		return HashBlocks(Namespace{Model: "m", LoRA: "sql", CacheSalt: salt}.Seed(), tk, bs, nil)
	}
	id := int64(3)
	tk := toks(1, 4)
	cases := []struct {
		name  string
		first func() kvevents.Event // blocks 0-1
		next  func() kvevents.Event // blocks 2-3, parent = block 1 (a later prefill chunk)
		salt  string
	}{
		{"lora_name in the event and the extra keys (current vLLM)", func() kvevents.Event {
			e := stored([]uint64{1, 2}, nil, tk[:2*bs])
			e.LoRAID, e.LoRAName = &id, "sql"
			e.ExtraKeys = []any{[]any{"sql", "salty"}, []any{"sql"}}
			return e
		}, func() kvevents.Event {
			p := uint64(2)
			e := stored([]uint64{3, 4}, &p, tk[2*bs:])
			e.LoRAID, e.LoRAName = &id, "sql"
			e.ExtraKeys = []any{[]any{"sql"}, []any{"sql"}}
			return e
		}, "salty"},
		{"lora_int_id in the extra keys (older vLLM)", func() kvevents.Event {
			e := stored([]uint64{1, 2}, nil, tk[:2*bs])
			e.LoRAID, e.LoRAName = &id, "sql"
			e.ExtraKeys = []any{[]any{int64(3)}, []any{int64(3)}}
			return e
		}, func() kvevents.Event {
			p := uint64(2)
			e := stored([]uint64{3, 4}, &p, tk[2*bs:])
			e.LoRAID, e.LoRAName = &id, "sql"
			e.ExtraKeys = []any{[]any{int64(3)}, []any{int64(3)}}
			return e
		}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ix, _ := newTestIndex(t)
			addWorkers(ix, "a")
			apply(t, ix, "a", 0, c.first(), c.next())
			if got := blocksOf(ix.Lookup(adapterKeys(tk, c.salt), nil)); got["a"] != 4 {
				t.Fatalf("adapter request matched %d of 4 blocks", got["a"])
			}
			if ms := ix.Lookup(keysOf("m", tk), nil); len(ms) != 0 {
				t.Fatalf("base-model request matched adapter blocks: %v", ms)
			}
		})
	}
}

// A vLLM whose BlockStored carries lora_id but no lora_name (nor extra keys) cannot be
// matched to an adapter name; its adapter blocks must at least not match base-model
// requests with the same tokens (the engine would not hit them).
func TestLoRAIDWithoutNameMatchesNoBaseRequest(t *testing.T) {
	ix, _ := newTestIndex(t)
	addWorkers(ix, "a")
	id := int64(7)
	tk := toks(1, 2)
	e := stored([]uint64{1, 2}, nil, tk)
	e.LoRAID = &id
	apply(t, ix, "a", 0, e)
	if ms := ix.Lookup(keysOf("m", tk), nil); len(ms) != 0 {
		t.Fatalf("base-model request matched blocks of lora_id 7: %v", ms)
	}
	zero := int64(0) // lora_id 0 is no adapter
	e = stored([]uint64{5, 6}, nil, toks(100, 2))
	e.LoRAID = &zero
	apply(t, ix, "a", 0, e)
	if got := blocksOf(ix.Lookup(keysOf("m", toks(100, 2)), nil)); got["a"] != 2 {
		t.Fatalf("lora_id 0 blocks are the base model's: %v", got)
	}
}
