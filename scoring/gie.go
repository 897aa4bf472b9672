package scoring

import (
	"container/list"
	"math/rand/v2"
	"sync"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/metrics"
)

// GIE re-implements the Gateway API Inference Extension / llm-d endpoint picker's
// *approximate* prefix-cache routing from its documentation (not its code):
// https://llm-d.ai/docs/architecture/advanced/kv-management/prefix-cache-aware-routing
// ("Approximate Implementation") and the GIE default scorer configuration.
//
//  1. The prompt text is split into fixed-size character blocks (no tokenizer: ≈16
//     tokens approximated as 64 characters), hashed as a rolling chain, at most
//     GIEMaxBlocks blocks.
//  2. Each worker has an in-memory LRU of the block hashes recently *sent* to it
//     (GIELRUBlocks per worker); nothing is learned from the engine.
//  3. Scores in [0,1]: prefix = matched leading blocks / prompt blocks; queue =
//     (max−q)/(max−min) over the candidates' waiting queues (1 when all equal); KV =
//     1 − KV-cache usage. Total = 3·prefix + 2·queue + 2·KV (configurable weights).
//  4. Highest total wins, ties at random; the prompt's blocks are then inserted into
//     the chosen worker's LRU.
//
// The queue is the scraped vllm:num_requests_waiting when the worker has been scraped,
// else kvroute's own prefilling bookings.
type GIE struct {
	b   Baselines
	rng *rand.Rand
	m   *metrics.Scoring

	mu  sync.Mutex           // guards lru; the router serializes Pick, the lock keeps the policy safe without one
	lru map[string]*blockLRU // worker → recently routed block hashes
}

func newGIE(o Options) *GIE {
	return &GIE{b: o.Baselines, rng: o.Rand, m: o.Metrics, lru: map[string]*blockLRU{}}
}

// Name implements Policy.
func (p *GIE) Name() string { return PolicyGIE }

// charBlocks returns the rolling hash chain of text's full blockChars-sized blocks.
func charBlocks(text string, blockChars, maxBlocks int) []uint64 {
	n := min(len(text)/blockChars, maxBlocks)
	out := make([]uint64, n)
	var prev [8]byte
	var d xxhash.Digest
	for i := 0; i < n; i++ {
		d.Reset()
		_, _ = d.Write(prev[:])
		_, _ = d.WriteString(text[i*blockChars : (i+1)*blockChars])
		h := d.Sum64()
		out[i] = h
		for j := 0; j < 8; j++ {
			prev[j] = byte(h >> (8 * j))
		}
	}
	return out
}

// Pick implements Policy.
func (p *GIE) Pick(in *Input, cands []Candidate) Decision {
	blocks := charBlocks(PromptText(in), p.b.GIEBlockChars, p.b.GIEMaxBlocks)
	p.mu.Lock()
	defer p.mu.Unlock()
	q := make([]float64, len(cands))
	minQ, maxQ := 0.0, 0.0
	for i := range cands {
		c := &cands[i]
		if !c.Load.ScrapedAt.IsZero() {
			q[i] = c.Load.Waiting
		} else {
			q[i] = float64(c.Booked.Prefilling)
		}
		if i == 0 || q[i] < minQ {
			minQ = q[i]
		}
		if i == 0 || q[i] > maxQ {
			maxQ = q[i]
		}
	}
	best := minRandom(p.rng, len(cands), func(i int) float64 {
		prefix := 0.0
		if l := p.lru[cands[i].Worker.Name]; l != nil && len(blocks) > 0 {
			prefix = float64(l.leading(blocks)) / float64(len(blocks))
		}
		queue := 1.0
		if maxQ > minQ {
			queue = (maxQ - q[i]) / (maxQ - minQ)
		}
		kv := 1 - min(max(cands[i].Load.KVUsage, 0), 1)
		return -(p.b.GIEPrefixWeight*prefix + p.b.GIEQueueWeight*queue + p.b.GIEKVWeight*kv)
	})
	if !in.DryRun {
		name := cands[best].Worker.Name
		l := p.lru[name]
		if l == nil {
			l = newBlockLRU(p.b.GIELRUBlocks)
			p.lru[name] = l
		}
		for _, h := range blocks {
			l.add(h)
		}
	}
	countPick(p.m, in, PolicyGIE)
	return Decision{Index: best, Reason: ReasonPolicy}
}

// blockLRU is a fixed-capacity set of block hashes, least recently added evicted first.
type blockLRU struct {
	cap   int
	order *list.List // front = most recent; values are uint64
	pos   map[uint64]*list.Element
}

func newBlockLRU(capacity int) *blockLRU {
	return &blockLRU{cap: capacity, order: list.New(), pos: map[uint64]*list.Element{}}
}

func (l *blockLRU) add(h uint64) {
	if e, ok := l.pos[h]; ok {
		l.order.MoveToFront(e)
		return
	}
	l.pos[h] = l.order.PushFront(h)
	for l.order.Len() > l.cap {
		e := l.order.Back()
		l.order.Remove(e)
		delete(l.pos, e.Value.(uint64))
	}
}

// leading counts how many of blocks, from the first, are held.
func (l *blockLRU) leading(blocks []uint64) int {
	for i, h := range blocks {
		if _, ok := l.pos[h]; !ok {
			return i
		}
	}
	return len(blocks)
}
