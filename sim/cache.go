package sim

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// blockPool is vLLM's paged KV cache with prefix caching (vllm/v1/core/block_pool.py):
// a fixed number of blocks, a map from block hash to cached blocks, and a free queue in
// LRU order. Blocks whose reference count drops to zero keep their hash and stay
// reusable until they are reallocated; reallocation evicts them (BlockRemoved).
type blockPool struct {
	blocks []block
	cached map[uint64][]int32 // engine hash → cached block ids (vLLM allows duplicates)
	// free queue: doubly linked list through blocks, head evicted first.
	head, tail int32
	nfree      int
	events     []Event
	medium     string
}

type block struct {
	ref        int
	hash       uint64
	hashed     bool
	prev, next int32
	inFree     bool
}

func newBlockPool(n int) *blockPool {
	p := &blockPool{blocks: make([]block, n), cached: make(map[uint64][]int32), head: -1, tail: -1, medium: "GPU"}
	for i := range p.blocks {
		p.pushTail(int32(i))
	}
	return p
}

func (p *blockPool) pushTail(id int32) {
	b := &p.blocks[id]
	b.prev, b.next, b.inFree = p.tail, -1, true
	if p.tail >= 0 {
		p.blocks[p.tail].next = id
	} else {
		p.head = id
	}
	p.tail = id
	p.nfree++
}

func (p *blockPool) unlink(id int32) {
	b := &p.blocks[id]
	if !b.inFree {
		return
	}
	if b.prev >= 0 {
		p.blocks[b.prev].next = b.next
	} else {
		p.head = b.next
	}
	if b.next >= 0 {
		p.blocks[b.next].prev = b.prev
	} else {
		p.tail = b.prev
	}
	b.prev, b.next, b.inFree = -1, -1, false
	p.nfree--
}

// free reports the blocks that can be allocated (free or cached without references).
func (p *blockPool) free() int { return p.nfree }

// usage is the fraction of blocks referenced by requests (vllm:kv_cache_usage_perc).
func (p *blockPool) usage() float64 {
	return 1 - float64(p.nfree)/float64(len(p.blocks))
}

// alloc takes n blocks from the head of the free queue, evicting cached ones.
// The caller has checked free() >= n.
func (p *blockPool) alloc(n int, dst []int32) []int32 {
	for i := 0; i < n; i++ {
		id := p.head
		p.unlink(id)
		p.evict(id)
		p.blocks[id].ref = 1
		dst = append(dst, id)
	}
	return dst
}

func (p *blockPool) evict(id int32) {
	b := &p.blocks[id]
	if !b.hashed {
		return
	}
	ids := p.cached[b.hash]
	for i, x := range ids {
		if x == id {
			ids = append(ids[:i], ids[i+1:]...)
			break
		}
	}
	if len(ids) == 0 {
		delete(p.cached, b.hash)
	} else {
		p.cached[b.hash] = ids
	}
	p.events = append(p.events, Event{Kind: BlockRemoved, Hashes: []uint64{b.hash}, Medium: p.medium})
	b.hashed, b.hash = false, 0
}

// lookup returns a cached block holding hash, if any.
func (p *blockPool) lookup(hash uint64) (int32, bool) {
	ids := p.cached[hash]
	if len(ids) == 0 {
		return -1, false
	}
	return ids[0], true
}

// touch takes a reference on a cached block (a prefix hit).
func (p *blockPool) touch(id int32) {
	b := &p.blocks[id]
	if b.ref == 0 {
		p.unlink(id)
	}
	b.ref++
}

// release drops one reference on each block, in reverse order so that a request's tail
// blocks are evicted before its head (vLLM free_blocks(reversed(...))).
func (p *blockPool) release(ids []int32) {
	for i := len(ids) - 1; i >= 0; i-- {
		b := &p.blocks[ids[i]]
		b.ref--
		if b.ref == 0 {
			p.pushTail(ids[i])
		}
	}
}

// commit gives a full block its hash and adds it to the prefix cache.
func (p *blockPool) commit(id int32, hash uint64) {
	b := &p.blocks[id]
	if b.hashed {
		return
	}
	b.hash, b.hashed = hash, true
	p.cached[hash] = append(p.cached[hash], id)
}

// reset drops every hash (vLLM reset_prefix_cache). It fails when blocks are still
// referenced, as vLLM does.
func (p *blockPool) reset() bool {
	if p.nfree != len(p.blocks) {
		return false
	}
	for i := range p.blocks {
		p.blocks[i].hashed, p.blocks[i].hash = false, 0
	}
	clear(p.cached)
	p.events = append(p.events, Event{Kind: AllBlocksCleared})
	return true
}

// blockHash is the engine's chained block hash: xxhash64(seed ‖ parent ‖ salt ‖ tokens).
// vLLM uses sha256 (or sha256_cbor) of (parent, tokens, extra keys) and a random
// NONE_HASH per process unless PYTHONHASHSEED is set; we mimic that with seed.
func blockHash(seed, parent uint64, salt string, tokens []uint32) uint64 {
	var d xxhash.Digest
	d.Reset()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	_, _ = d.Write(b[:])
	binary.LittleEndian.PutUint64(b[:], parent)
	_, _ = d.Write(b[:])
	_, _ = d.WriteString(salt)
	buf := make([]byte, 4*len(tokens))
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(buf[4*i:], t)
	}
	_, _ = d.Write(buf)
	return d.Sum64()
}
