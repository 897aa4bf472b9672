package scoring

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute/workers"
)

// fcfsPool is a minimal virtual-time pool for scoring tests: each worker prefills its
// requests FCFS, one at a time, at 5,000 tokens/s divided by its slowness; a request's
// TTFT is its wait plus its prefill. Every worker is configured alike (the prior says
// 5,000 tokens/s for all), as in the heterogeneous-pool row of issue 12.
type fcfsPool struct {
	slow   []float64
	ws     []*workers.Worker
	freeAt []time.Time
	queue  [][]pending // per worker, requests without a first token yet
}

type pending struct {
	start, first time.Time
	tokens       int
	pred         Prediction
}

func newFCFSPool(slow []float64) *fcfsPool {
	p := &fcfsPool{slow: slow, freeAt: make([]time.Time, len(slow)), queue: make([][]pending, len(slow))}
	for i := range slow {
		p.ws = append(p.ws, &workers.Worker{Name: fmt.Sprintf("w%02d", i), Profile: workers.Profile{PrefillTokensPerSecond: 5000}})
	}
	return p
}

// run routes n requests (Poisson, rate req/s, 1,000–4,000 uncached tokens) with pol
// and returns the mean TTFT and the requests per worker.
func (p *fcfsPool) run(pol Policy, n int, rate float64, seed uint64) (time.Duration, []int) {
	rng := rand.New(rand.NewPCG(seed, seed))
	now := t0
	var sum time.Duration
	count := make([]int, len(p.ws))
	learner, _ := pol.(Learner)
	for k := 0; k < n; k++ {
		now = now.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		cs := make([]Candidate, len(p.ws))
		for i := range p.ws {
			// First tokens that happened by now are observed and released.
			q := p.queue[i][:0]
			for _, r := range p.queue[i] {
				if !r.first.After(now) {
					if learner != nil {
						learner.Observe(Observation{Worker: p.ws[i].Name, PromptTokens: r.tokens, Predicted: r.pred, Start: r.start, TTFT: r.first.Sub(r.start)})
					}
					continue
				}
				q = append(q, r)
			}
			p.queue[i] = q
			cs[i] = Candidate{Worker: p.ws[i]}
			for _, r := range q {
				cs[i].Booked.Requests++
				cs[i].Booked.Prefilling++
				cs[i].Booked.PrefillTokens += r.tokens
			}
		}
		tok := 1000 + rng.IntN(3000)
		in := &Input{Model: "m", PromptTokens: tok, BlockSize: 16, Now: now}
		d := pol.Pick(in, cs)
		w := d.Index
		start := now
		if p.freeAt[w].After(start) {
			start = p.freeAt[w]
		}
		first := start.Add(time.Duration(float64(tok) / 5000 * p.slow[w] * float64(time.Second)))
		p.freeAt[w] = first
		p.queue[w] = append(p.queue[w], pending{start: now, first: first, tokens: tok, pred: d.Predictions[w]})
		sum += first.Sub(now)
		count[w]++
	}
	return sum / time.Duration(n), count
}

// TestHeterogeneousPoolLearnsSpeeds: four workers configured alike whose real prefill
// speeds are 1, 1, ½ and ⅓ of the prior, at ≈ 75 % of the pool's real capacity. The
// static model splits the work evenly and overloads the slow ones; the learned model
// (shrinkage toward the pool does not erase real differences) sends them less and
// has a lower mean TTFT (measured 0.96 s vs 1.01 s; before issue 12's changes 0.92 s
// vs 1.01 s: the pool prior costs a little here); the slowest worker is still used
// (not starved). In a FCFS toy with one
// request in service the bookings are nearly exact, so the gain is only from routing
// less to the slow workers.
func TestHeterogeneousPoolLearnsSpeeds(t *testing.T) {
	slow := []float64{1, 1, 2, 3}
	const n, rate = 3000, 4.2 // 4.2 × 2,500 tokens ≈ 0.74 × 14,167 tokens/s
	static, sc := newFCFSPool(slow).run(NewPredictor(Options{Rand: seeded(1)}, false), n, rate, 7)
	learned, lc := newFCFSPool(slow).run(NewPredictor(Options{Rand: seeded(1)}, true), n, rate, 7)
	t.Logf("mean TTFT static %v %v, learned %v %v", static, sc, learned, lc)
	if float64(learned)*1.04 > float64(static) {
		t.Fatalf("learned mean TTFT %v not 1.04× better than static %v (picks %v vs %v)", learned, static, lc, sc)
	}
	if lc[3] >= lc[0] || lc[3] < n/40 {
		t.Fatalf("the slowest worker should get less than a fast one but not be shut out: %v", lc)
	}
}
