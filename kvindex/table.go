package kvindex

import "sync"

// nShards is the number of key-space shards. Writers lock one shard per block, so
// workers' event streams applied on different goroutines rarely contend; a Lookup
// read-locks all of them once (cheaper than a lock round trip per key, and the keys of
// one prompt spread over every shard anyway).
const nShards = 32

func shardOf(k Key) int { return int(uint64(k) >> 59) } // top 5 bits: keys are xxhash output, uniform

// shard is one part of the key space.
type shard struct {
	mu sync.RWMutex
	m  map[Key]hset // guarded by mu
	_  [40]byte     // keep neighbouring shards' locks off one cache line
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
	if h.spec() {
		if h.wf&fNoExp == 0 && after(now, h.stamp) {
			return 0, false
		}
		return TierGPU, true
	}
	for t := Tier(0); t < NumTiers; t++ {
		if h.tierRefs(t) > 0 {
			return t, true
		}
	}
	return 0, false
}

// hset is the holders of one key: the first inline (most keys are held by one or a few
// workers), the rest in a slice. Map values are copied, so updates write it back.
type hset struct {
	h0   holder
	more *[]holder
}

func (s *hset) each(f func(holder) bool) {
	if s.h0.wf != 0 && !f(s.h0) {
		return
	}
	if s.more != nil {
		for _, h := range *s.more {
			if !f(h) {
				return
			}
		}
	}
}

func (s *hset) empty() bool { return s.h0.wf == 0 && s.more == nil }

// get returns a pointer to id's holder, or nil.
func (s *hset) get(id uint16) *holder {
	if s.h0.wf != 0 && s.h0.id() == id {
		return &s.h0
	}
	if s.more != nil {
		for i := range *s.more {
			if (*s.more)[i].id() == id {
				return &(*s.more)[i]
			}
		}
	}
	return nil
}

// add inserts h (its id must be absent) and reports whether it went to the overflow.
func (s *hset) add(h holder) bool {
	if s.h0.wf == 0 {
		s.h0 = h
		return false
	}
	if s.more == nil {
		s.more = &[]holder{}
	}
	*s.more = append(*s.more, h)
	return true
}

// del removes id's holder and reports whether one was removed from the overflow.
func (s *hset) del(id uint16) (removed, fromMore bool) {
	if s.h0.wf != 0 && s.h0.id() == id {
		if s.more != nil && len(*s.more) > 0 {
			m := *s.more
			s.h0 = m[len(m)-1]
			*s.more = m[:len(m)-1]
			if len(*s.more) == 0 {
				s.more = nil
			}
			return true, true
		}
		s.h0 = holder{}
		return true, false
	}
	if s.more != nil {
		m := *s.more
		for i := range m {
			if m[i].id() == id {
				m[i] = m[len(m)-1]
				*s.more = m[:len(m)-1]
				if len(*s.more) == 0 {
					s.more = nil
				}
				return true, true
			}
		}
	}
	return false, false
}

// update runs f on id's holder of key k under the shard's write lock, creating the
// holder with create() when absent and create != nil. f returns false to delete the
// holder. It returns the holder's state before (zero if absent) and after.
func (ix *Index) update(k Key, id uint16, create func() holder, f func(*holder) bool) (before, after holder, existed bool) {
	sh := &ix.shards[shardOf(k)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s, ok := sh.m[k]
	h := s.get(id)
	if h == nil {
		if create == nil {
			return holder{}, holder{}, false
		}
		nh := create()
		if !f(&nh) {
			return holder{}, holder{}, false
		}
		if !ok {
			ix.nKeys.Add(1)
		}
		if s.add(nh) {
			ix.nMore.Add(1)
		}
		ix.nHolders.Add(1)
		sh.m[k] = s
		return holder{}, nh, false
	}
	before = *h
	if f(h) {
		after = *h
		sh.m[k] = s
		return before, after, true
	}
	if _, fromMore := s.del(id); fromMore {
		ix.nMore.Add(-1)
	}
	ix.nHolders.Add(-1)
	if s.empty() {
		delete(sh.m, k)
		ix.nKeys.Add(-1)
	} else {
		sh.m[k] = s
	}
	return before, holder{}, true
}

// peek returns id's holder of k under a read lock.
func (ix *Index) peek(k Key, id uint16) (holder, bool) {
	sh := &ix.shards[shardOf(k)]
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	s, ok := sh.m[k]
	if !ok {
		return holder{}, false
	}
	if h := s.get(id); h != nil {
		return *h, true
	}
	return holder{}, false
}
