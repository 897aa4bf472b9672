package tokenize

import (
	"container/list"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
)

// segmentCache is a byte-bounded LRU from a text run (between added tokens) to its
// token ids. Chat templates put special tokens (<|im_end|>, <|eot_id|>, …) around every
// message, and BPE never merges across them, so each message's ids are independent of
// what follows: the next turn of a conversation finds every earlier run here and only
// encodes the new one.
//
// Keys are the xxhash64 of the run plus its length, not the text, to keep the cache
// small; two different runs of equal length colliding on 64 bits (about 2^-64 per pair)
// would return wrong ids, which only costs a worse pick, never a wrong response.
type segmentCache struct {
	min   int   // shortest run worth caching, bytes
	limit int64 // bound on charged bytes

	mu    sync.Mutex // guards lru, items, bytes
	lru   *list.List // front = most recent; values are *cacheEntry
	items map[cacheKey]*list.Element
	bytes int64

	hits, misses   atomic.Int64
	hitTextBytes   atomic.Int64
	missTextBytes  atomic.Int64
	evictedEntries atomic.Int64
}

type cacheKey struct {
	h uint64
	n int
}

type cacheEntry struct {
	key cacheKey
	ids []uint32
}

// entryOverhead approximates the bytes one entry costs beyond its ids (list element,
// map slot, slice header).
const entryOverhead = 120

func newSegmentCache(limit int64, min int) *segmentCache {
	return &segmentCache{min: min, limit: limit, lru: list.New(), items: map[cacheKey]*list.Element{}}
}

func (c *segmentCache) get(s string) ([]uint32, bool) {
	k := cacheKey{xxhash.Sum64String(s), len(s)}
	c.mu.Lock()
	e, ok := c.items[k]
	if ok {
		c.lru.MoveToFront(e)
	}
	c.mu.Unlock()
	if !ok {
		c.misses.Add(1)
		c.missTextBytes.Add(int64(len(s)))
		return nil, false
	}
	c.hits.Add(1)
	c.hitTextBytes.Add(int64(len(s)))
	return e.Value.(*cacheEntry).ids, true
}

func (c *segmentCache) put(s string, ids []uint32) {
	cost := int64(4*len(ids) + entryOverhead)
	if cost > c.limit {
		return
	}
	k := cacheKey{xxhash.Sum64String(s), len(s)}
	own := append([]uint32(nil), ids...)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.items[k]; ok {
		return
	}
	c.items[k] = c.lru.PushFront(&cacheEntry{key: k, ids: own})
	c.bytes += cost
	for c.bytes > c.limit {
		e := c.lru.Back()
		ce := e.Value.(*cacheEntry)
		c.lru.Remove(e)
		delete(c.items, ce.key)
		c.bytes -= int64(4*len(ce.ids) + entryOverhead)
		c.evictedEntries.Add(1)
	}
}

// CacheStats describes a model's segment cache.
// The JSON names are what GET /debug/tokenize shows.
type CacheStats struct {
	Hits          int64 `json:"hits"`            // lookups of runs at least MinCachedSegment long
	Misses        int64 `json:"misses"`          // idem, not found
	HitTextBytes  int64 `json:"hit_text_bytes"`  // text bytes served from the cache
	MissTextBytes int64 `json:"miss_text_bytes"` // text bytes encoded on a miss
	Evictions     int64 `json:"evictions"`       // entries evicted (LRU, over the byte budget)
	Bytes         int64 `json:"bytes"`           // charged size now
	Entries       int   `json:"entries"`         // entries held now
}

// CacheStats returns the segment cache's counters (zero when the cache is disabled).
func (m *Model) CacheStats() CacheStats {
	c := m.cache
	if c == nil {
		return CacheStats{}
	}
	c.mu.Lock()
	b, n := c.bytes, len(c.items)
	c.mu.Unlock()
	return CacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), HitTextBytes: c.hitTextBytes.Load(),
		MissTextBytes: c.missTextBytes.Load(), Evictions: c.evictedEntries.Load(), Bytes: b, Entries: n}
}
