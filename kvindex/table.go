package kvindex

import (
	"math/bits"
	"sync"
	"unsafe"
)

// nShards is the number of key-space shards. Writers lock one shard per block, so
// workers' event streams applied on different goroutines rarely contend; a Lookup
// read-locks all of them once (cheaper than a lock round trip per key, and the keys of
// one prompt spread over every shard anyway).
const nShards = 32

// shardOf is k's shard: the top 5 bits of the keyed mix (a party choosing keys must
// not be able to put them all in one shard either).
func shardOf(k Key) int { return int(mix(uint64(k)) >> 59) }

// shard is one part of the key space: key → holders, one table slot per key. A key
// held by one worker stores its holder inline in the slot; a key held by several
// stores an overflow marker (wf = 0, refs = count, stamp = offset) into arena, where
// its holders lie contiguously in a power-of-two sized chunk. (A multimap with one slot
// per (key, worker) was measured first: keys shared by tens of workers form long runs
// that every probe crosses, 10× slower lookups; per-key slices cost a third dependent
// cache miss per key.)
type shard struct {
	mu    sync.RWMutex
	t     ktab       // guarded by mu
	arena []holder   // guarded by mu; overflow chunks
	free  [][]uint32 // guarded by mu; free chunk offsets by size class (chunk = 2<<class holders)
	nMore int        // guarded by mu; holders in overflow chunks
	_     [40]byte   // keep neighbouring shards' locks off one cache line
}

func classOf(n int) int { return bits.Len(uint(n-1)) - 1 } // smallest class with 2<<class ≥ n (n ≥ 2)

func (sh *shard) alloc(class int) uint32 {
	for len(sh.free) <= class {
		sh.free = append(sh.free, nil)
	}
	if l := sh.free[class]; len(l) > 0 {
		off := l[len(l)-1]
		sh.free[class] = l[:len(l)-1]
		return off
	}
	off := len(sh.arena)
	sh.arena = append(sh.arena, make([]holder, 2<<class)...)
	return uint32(off)
}

func (sh *shard) release(off uint32, class int) {
	clear(sh.arena[off : int(off)+2<<class])
	sh.free[class] = append(sh.free[class], off)
}

// holders returns k's holders: a one-element slice aliasing the slot, or its overflow
// chunk. Valid until the shard is next modified. Caller holds sh.mu.
func (sh *shard) holders(k Key) (slot int, hs []holder) {
	i := sh.t.find(uint64(k))
	if i < 0 {
		return -1, nil
	}
	return i, sh.holdersAt(i)
}

func (sh *shard) holdersAt(i int) []holder {
	h := &sh.t.s[i].h
	if h.wf != 0 {
		return unsafeOne(h)
	}
	return sh.arena[h.stamp : h.stamp+uint32(h.refs)]
}

// locate returns the slot of k (or -1) and id's holder in it (or nil). Caller holds sh.mu.
func (sh *shard) locate(k Key, id uint16) (slot int, h *holder) {
	slot, hs := sh.holders(k)
	for j := range hs {
		if hs[j].id() == id {
			return slot, &hs[j]
		}
	}
	return slot, nil
}

// locateMixed is locate of k whose mix is m (mix(uint64(k))).
func (sh *shard) locateMixed(k Key, m uint64, id uint16) (slot int, h *holder) {
	kk := uint64(k)
	if kk == 0 { // its shard is mix(0)'s, its slot chain 1's (rhKey)
		kk, m = 1, mix(1)
	}
	slot = sh.t.findMixed(kk, m)
	if slot < 0 {
		return -1, nil
	}
	hs := sh.holdersAt(slot)
	for j := range hs {
		if hs[j].id() == id {
			return slot, &hs[j]
		}
	}
	return slot, nil
}

// add inserts holder h (its worker must not hold k yet) and reports whether k is new.
func (sh *shard) add(k Key, slot int, h holder) (newKey bool) {
	if slot < 0 {
		sh.t.insert(uint64(k), h)
		return true
	}
	cur := &sh.t.s[slot].h
	if cur.wf != 0 {
		off := sh.alloc(0)
		sh.arena[off], sh.arena[off+1] = *cur, h
		*cur = holder{refs: 2, stamp: off}
		sh.nMore += 2
		return false
	}
	n := int(cur.refs)
	if n&(n-1) == 0 { // chunk full (sizes are powers of two): move to the next class
		class := classOf(n)
		off := sh.alloc(class + 1)
		copy(sh.arena[off:], sh.arena[cur.stamp:cur.stamp+uint32(n)])
		sh.release(cur.stamp, class)
		cur.stamp = off
	}
	sh.arena[cur.stamp+uint32(n)] = h
	cur.refs++
	sh.nMore++
	return false
}

// remove deletes id's holder of k and reports whether k has no holder left.
func (sh *shard) remove(k Key, slot int, id uint16) (keyGone bool) {
	cur := &sh.t.s[slot].h
	if cur.wf != 0 {
		sh.t.del(slot)
		return true
	}
	n := int(cur.refs)
	l := sh.arena[cur.stamp : cur.stamp+uint32(n)]
	for j := range l {
		if l[j].id() == id {
			l[j] = l[n-1]
			l[n-1] = holder{}
			n--
			sh.nMore--
			break
		}
	}
	// Invariant: a chunk holding c ≥ 2 holders is of class classOf(c).
	class := classOf(int(cur.refs))
	if n == 1 {
		h := l[0]
		sh.release(cur.stamp, class)
		*cur = h
		sh.nMore--
		return false
	}
	if nc := classOf(n); nc < class {
		off := sh.alloc(nc)
		copy(sh.arena[off:], l[:n])
		sh.release(cur.stamp, class)
		cur.stamp = off
	}
	cur.refs = uint16(n)
	return false
}

// holder is one worker's claim on one key, packed in 8 bytes:
//
//	wf    worker id (low 13 bits) | fSpec | fNoExp
//	refs  per tier, a 4-bit count of engine entries (rank, engine hash) holding the
//	      key in that tier (saturating at 15); all zero for a speculative holder
//	stamp milliseconds tick: a speculative holder's expiry, or a confirmed holder's
//	      last store/use (for LRU eviction)
type holder struct {
	wf    uint16
	refs  uint16
	stamp uint32
}

const (
	idMask   = 1<<13 - 1 // worker ids 1..8191; 0 marks an empty slot
	maxID    = idMask
	fSpec    = 1 << 13 // speculative: booked at pick time, not confirmed by an event
	fNoExp   = 1 << 14 // speculative without TTL (approximate worker bounded by capacity)
	tierBits = 4
)

func (h holder) id() uint16 { return h.wf & idMask }
func (h holder) spec() bool { return h.wf&fSpec != 0 }
func (h holder) tierRefs(t Tier) uint16 {
	return (h.refs >> (tierBits * uint16(t))) & (1<<tierBits - 1)
}

// addRef changes t's count by d (±1), saturating in 0..15.
func (h *holder) addRef(t Tier, d int) {
	n := int(h.tierRefs(t)) + d
	n = min(max(n, 0), 1<<tierBits-1)
	sh := tierBits * uint16(t)
	h.refs = h.refs&^((1<<tierBits-1)<<sh) | uint16(n)<<sh
}

// live reports whether h counts at tick now, and in which tier (the fastest held).
func (h holder) live(now uint32) (Tier, bool) {
	if h.wf&fSpec == 0 {
		if h.refs == 0 {
			return 0, false
		}
		return Tier(bits.TrailingZeros16(h.refs) / tierBits), true
	}
	if h.wf&fNoExp == 0 && after(now, h.stamp) {
		return 0, false
	}
	return TierGPU, true
}

// update runs f on id's holder of key k under the shard's write lock, creating the
// holder with create() when absent and create != nil. f returns false to delete the
// holder. It returns the holder's state before (zero if absent) and after (zero if
// deleted), and whether it existed.
func (ix *Index) update(k Key, id uint16, create func() holder, f func(*holder) bool) (before, after holder, existed bool) {
	sh := &ix.shards[shardOf(k)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	slot, h := sh.locate(k, id)
	if h == nil {
		if create == nil {
			return holder{}, holder{}, false
		}
		nh := create()
		if !f(&nh) {
			return holder{}, holder{}, false
		}
		ix.added(sh.add(k, slot, nh))
		return holder{}, nh, false
	}
	before = *h
	if f(h) {
		return before, *h, true
	}
	ix.removed(sh.remove(k, slot, id))
	return before, holder{}, true
}

// counts accumulates the changes one batch makes to the index-wide counters (nKeys,
// nHolders, nEng), so a batch costs one atomic add per counter instead of several per
// block. A nil *counts applies each change at once.
type counts struct{ keys, holders, eng int64 }

func (ix *Index) count(c *counts, keys, holders, eng int64) {
	if c != nil {
		c.keys += keys
		c.holders += holders
		c.eng += eng
		return
	}
	ix.flush(&counts{keys, holders, eng})
}

// flush applies c to the index-wide counters.
func (ix *Index) flush(c *counts) {
	if c.keys != 0 {
		ix.nKeys.Add(c.keys)
	}
	if c.holders != 0 {
		ix.nHolders.Add(c.holders)
	}
	if c.eng != 0 {
		ix.nEng.Add(c.eng)
	}
	*c = counts{}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func (ix *Index) added(newKey bool) {
	if newKey {
		ix.nKeys.Add(1)
	}
	ix.nHolders.Add(1)
}

func (ix *Index) removed(keyGone bool) {
	if keyGone {
		ix.nKeys.Add(-1)
	}
	ix.nHolders.Add(-1)
}

// confirm records one more engine reference (when first) of id on k in tier t and
// reports whether it replaced a speculative holder: the hot path of BlockStored.
func (ix *Index) confirm(k Key, id uint16, t Tier, first bool, now uint32, c *counts) (wasSpec bool) {
	sh := &ix.shards[shardOf(k)]
	sh.mu.Lock()
	slot, at, d := sh.t.probe(uint64(k))
	var h *holder
	if slot >= 0 {
		hs := sh.holdersAt(slot)
		for j := range hs {
			if hs[j].id() == id {
				h = &hs[j]
				break
			}
		}
	}
	if h == nil {
		nh := holder{wf: id, stamp: now}
		nh.addRef(t, 1)
		newKey := slot < 0
		if newKey { // one probe: insert where the lookup stopped
			sh.t.insertAt(uint64(k), nh, at, d)
		} else {
			sh.add(k, slot, nh)
		}
		sh.mu.Unlock()
		ix.count(c, b2i(newKey), 1, 0)
		return false
	}
	if h.spec() {
		wasSpec = true
		*h = holder{wf: id}
		first = true
	}
	if first {
		h.addRef(t, 1)
	}
	h.stamp = now
	sh.mu.Unlock()
	return wasSpec
}

// unref releases one engine reference of id on k in tier t; the holder goes when none
// is left. The hot path of BlockRemoved.
func (ix *Index) unref(k Key, id uint16, t Tier, c *counts) {
	sh := &ix.shards[shardOf(k)]
	sh.mu.Lock()
	if slot, h := sh.locate(k, id); h != nil {
		h.addRef(t, -1)
		if h.refs == 0 && !h.spec() {
			ix.count(c, -b2i(sh.remove(k, slot, id)), -1, 0)
		}
	}
	sh.mu.Unlock()
}

// peek returns id's holder of k under a read lock.
func (ix *Index) peek(k Key, id uint16) (holder, bool) {
	sh := &ix.shards[shardOf(k)]
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	if _, h := sh.locate(k, id); h != nil {
		return *h, true
	}
	return holder{}, false
}

// unsafeOne returns a one-element slice aliasing *h.
func unsafeOne(h *holder) []holder { return unsafe.Slice(h, 1) }
