package router

import (
	"sync"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// pickScratch is one Pick's working memory: its input, the candidate list and what is
// gathered per candidate (workers, scraped loads, index matches), the block keys and
// the policy's own scratch (scoring.Scratch). Pick takes one from scratchPool and puts
// it back when it returns, having copied into the Ticket all it keeps, so that a pick
// over n workers allocates nothing per worker once the pool holds scratches of that
// size (at 1,000 workers a pick allocated ≈ 1 MB, and the garbage collections that
// drove set its p99). A scratch serves one pick at a time: concurrent picks each take
// their own. Explain, whose result outlives the call, uses none.
type pickScratch struct {
	in      input
	ws      []*workers.Worker
	cands   []scoring.Candidate
	loads   []workers.Load
	matches []kvindex.Match
	keys    []kvindex.Key
	policy  scoring.Scratch
}

var scratchPool = sync.Pool{New: func() any { return new(pickScratch) }}

// getScratch returns a scratch for one pick; putScratch hands it back once nothing of
// the pick refers to it.
func getScratch() *pickScratch { return scratchPool.Get().(*pickScratch) }

func putScratch(sc *pickScratch) {
	sc.reset()
	scratchPool.Put(sc)
}

// reset drops what sc points at, keeping its arrays.
func (sc *pickScratch) reset() {
	// Drop what the slices point at (workers, the request, tokens), so that a pooled
	// scratch does not keep a removed worker or an old request alive; their arrays stay.
	// Each slice's length is the most this pick wrote (what shrank, shrank in place), and
	// past it every element was cleared by an earlier put.
	clear(sc.ws)
	clear(sc.cands)
	clear(sc.loads)
	clear(sc.matches)
	sc.policy.Reset()
	sc.in = input{}
}

// grown returns s with length n, reusing its array when it is large enough; the
// elements keep whatever they held (callers assign every one).
func grown[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
