package tokenize

import (
	"container/list"
	"encoding/binary"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/jsonvalue"
	"github.com/kvroute/kvroute/request"
)

// renderCache is a byte-bounded LRU from a conversation prefix (the hash of its
// messages, chained, and of every other template input) to what rendering and
// tokenizing that prefix produced: the rendered text with add_generation_prompt off,
// the ids of that text up to a safe cut (just after an added token), and the render
// of the window head the next turn will need (incremental.go).
//
// Keys are 64-bit hashes: two different conversations colliding (about 2^-64 per
// pair) would give wrong ids, which only costs a worse pick, never a wrong response.
type renderCache struct {
	limit int64

	mu    sync.Mutex // guards lru, items, bytes
	lru   *list.List // front = most recent; values are *renderEntry
	items map[renderKey]*list.Element
	bytes int64

	hits, misses, stores, evictions atomic.Int64
	checks, disagreements           atomic.Int64
	// off is set when the self-check found a fast-path render that differs from the
	// full render: the model renders in full from then on.
	off atomic.Bool
	// checking is 1 while a self-check runs (at most one at a time per model).
	checking atomic.Int32
	served   atomic.Int64 // fast-path renders, for sampling the self-check

	proofMu sync.Mutex // guards proofs, seen
	proofs  map[uint64]*proof
	seen    map[uint64]struct{} // inputs seen once, without a proof
	proving atomic.Int32        // background proofs running
	proofWG sync.WaitGroup
}

type renderKey struct {
	ctx, msgs uint64 // hash of the template inputs other than messages; chained message hash
	n         int    // messages in the prefix
}

type renderEntry struct {
	key renderKey
	// A conversation's entries share their prefix: an entry holds what follows its
	// parent's text and ids (a root holds all of them), so a turn stores only its new
	// part. The parent is kept alive by its children even once evicted; each entry is
	// charged its whole length, so the bound holds whatever is shared.
	parent  *renderEntry
	depth   int      // parents above
	text    string   // the render after parent's text (flags off)
	textLen int      // len of the whole render
	cut     int      // the whole render's [:cut] ends just after an added token
	ids     []uint32 // the ids after parent's cut up to cut (no post-processor tokens)
	idsLen  int      // ids of the whole render up to cut
	head    string   // the render of the prefix's window head (window.go), flags off
	feat    uint8    // features of the prefix's messages (featSystem, ...)
}

func (e *renderEntry) cost() int64 {
	return int64(e.textLen + len(e.head) + 4*e.idsLen + entryOverhead)
}

// textFrom returns the whole render from offset off.
func (e *renderEntry) textFrom(off int) string {
	start := e.textLen - len(e.text)
	if off >= start {
		return e.text[off-start:]
	}
	var parts []string
	for x := e; x != nil; x = x.parent {
		parts = append(parts, x.text)
		if x.textLen-len(x.text) <= off {
			break
		}
	}
	slices.Reverse(parts)
	whole := strings.Join(parts, "")
	return whole[len(whole)-(e.textLen-off):]
}

// appendIDs appends the ids of the whole render up to cut.
func (e *renderEntry) appendIDs(dst []uint32) []uint32 {
	var chain [64]*renderEntry
	parts := chain[:0]
	for x := e; x != nil; x = x.parent {
		parts = append(parts, x)
	}
	for i := len(parts) - 1; i >= 0; i-- {
		dst = append(dst, parts[i].ids...)
	}
	return dst
}

// maxDepth bounds an entry's parent chain: a deeper one is stored flat.
const maxDepth = 48

// DefaultRenderCacheBytes is the render cache bound when Options.RenderCacheBytes is
// 0: 128 MiB, about 75 conversation prefixes of 100k tokens (text and ids).
const DefaultRenderCacheBytes = 128 << 20

func newRenderCache(limit int64) *renderCache {
	return &renderCache{limit: limit, lru: list.New(), items: map[renderKey]*list.Element{}, proofs: map[uint64]*proof{}, seen: map[uint64]struct{}{}}
}

func (c *renderCache) get(k renderKey) *renderEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[k]
	if !ok {
		return nil
	}
	c.lru.MoveToFront(e)
	return e.Value.(*renderEntry)
}

func (c *renderCache) put(e *renderEntry) {
	cost := e.cost()
	if cost > c.limit {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.items[e.key]; ok {
		c.lru.MoveToFront(old)
		return
	}
	c.items[e.key] = c.lru.PushFront(e)
	c.bytes += cost
	c.stores.Add(1)
	for c.bytes > c.limit {
		b := c.lru.Back()
		be := b.Value.(*renderEntry)
		c.lru.Remove(b)
		delete(c.items, be.key)
		c.bytes -= be.cost()
		c.evictions.Add(1)
	}
}

// RenderCacheStats describes a model's render cache (incremental chat rendering).
// The JSON names are what GET /debug/tokenize shows.
type RenderCacheStats struct {
	Hits          int64 `json:"hits"`          // chat requests rendered from a cached prefix
	Misses        int64 `json:"misses"`        // chat requests rendered in full
	Stores        int64 `json:"stores"`        // prefixes stored
	Evictions     int64 `json:"evictions"`     // prefixes evicted (LRU, over the byte budget)
	Checks        int64 `json:"checks"`        // sampled fast-path renders compared with a full render
	Disagreements int64 `json:"disagreements"` // of those, renders that differed (the cache then turns off)
	Off           bool  `json:"off"`           // turned off by a disagreement
	Bytes         int64 `json:"bytes"`         // charged size now
	Entries       int   `json:"entries"`       // prefixes held now
}

// RenderCacheStats returns the render cache's counters (zero when disabled).
func (m *Model) RenderCacheStats() RenderCacheStats {
	c := m.render
	if c == nil {
		return RenderCacheStats{}
	}
	c.mu.Lock()
	b, n := c.bytes, len(c.items)
	c.mu.Unlock()
	return RenderCacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Stores: c.stores.Load(), Evictions: c.evictions.Load(),
		Checks: c.checks.Load(), Disagreements: c.disagreements.Load(), Off: c.off.Load(), Bytes: b, Entries: n}
}

// hasher writes jsonvalue trees into an xxhash digest, kind-tagged and
// length-prefixed so that distinct trees give distinct byte streams.
type hasher struct {
	d   *xxhash.Digest
	buf [9]byte
}

func (h *hasher) tag(k byte, n int) {
	h.buf[0] = k
	binary.LittleEndian.PutUint64(h.buf[1:], uint64(n))
	h.d.Write(h.buf[:])
}

func (h *hasher) str(s string) {
	h.tag('s', len(s))
	h.d.WriteString(s)
}

func (h *hasher) value(v jsonvalue.Value) {
	switch v.Kind() {
	case jsonvalue.Object:
		ms := v.Members()
		h.tag('o', len(ms))
		for _, m := range ms {
			h.str(m.Key)
			h.value(m.Value)
		}
	case jsonvalue.Array:
		h.tag('a', v.Len())
		for i := range v.Len() {
			h.value(v.Index(i))
		}
	case jsonvalue.Bool:
		if v.Boolean() {
			h.tag('t', 0)
		} else {
			h.tag('f', 0)
		}
	case jsonvalue.Null:
		h.tag('n', 0)
	default: // string, number: their text
		h.tag(byte('0'+v.Kind()), len(v.Text()))
		h.d.WriteString(v.Text())
	}
}

// contextHash hashes every template input but the messages and the two generation
// flags: tools, chat_template_kwargs, reasoning_effort (the special tokens are the
// model's).
func contextHash(req *request.Request) uint64 {
	h := hasher{d: xxhash.New()}
	h.tag('T', len(req.Tools))
	for _, t := range req.Tools {
		h.value(t)
	}
	h.tag('K', len(req.ChatTemplateKwargs))
	for _, kw := range req.ChatTemplateKwargs {
		h.str(kw.Key)
		h.value(kw.Value)
	}
	h.str(req.ReasoningEffort)
	return h.d.Sum64()
}

// prefixHashes returns out[i] = the chained hash of msgs[:i+1] under ctx.
func prefixHashes(ctx uint64, msgs []jsonvalue.Value, out []uint64) []uint64 {
	h := hasher{d: xxhash.New()}
	prev := ctx
	for _, msg := range msgs {
		h.d.Reset()
		h.tag('m', int(prev))
		h.value(msg)
		prev = h.d.Sum64()
		out = append(out, prev)
	}
	return out
}
