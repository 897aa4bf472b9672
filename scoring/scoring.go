// Package scoring predicts each worker's time to first token (TTFT) for a request and
// picks a worker. It also holds the baseline policies used for comparison.
//
// The router calls Policy.Pick with its lock held, so a burst of requests is decided
// one at a time against the bookings of those before it; policies therefore see
// consistent in-flight state and need no lock for state touched only in Pick.
package scoring

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/workers"
)

// Booked is kvroute's own in-flight view of one worker, kept by the router.
type Booked struct {
	Requests      int `json:"requests"`       // requests routed here and not yet finished
	PrefillTokens int `json:"prefill_tokens"` // uncached prompt tokens of booked requests without a first token yet
	Prefilling    int `json:"prefilling"`     // booked requests without a first token yet
	Decoding      int `json:"decoding"`       // booked requests past their first token, still generating
}

// Candidate is one worker that can serve the request, with everything known about it
// at pick time.
type Candidate struct {
	Worker *workers.Worker
	// Cached is the worker's cached leading prefix for this request (kvindex lookup).
	Cached kvindex.Match
	// CachedTokens = Cached.Blocks × block size, capped at PromptTokens − 1 (vLLM never
	// serves the whole prompt from cache: the last token is always recomputed).
	CachedTokens int
	Booked       Booked
	Load         workers.Load // the worker's own scraped view; zero ScrapedAt = unknown
}

// Input is the request as scoring sees it.
type Input struct {
	RequestID    string
	Request      *request.Request // the parsed request (for text-based baselines); may be nil
	Model        string
	PromptTokens int           // prompt length in tokens; 0 when tokenization was unavailable
	Tokens       []uint32      // prompt token ids; nil when unavailable
	Keys         []kvindex.Key // block keys of Tokens; nil when unavailable
	BlockSize    int           // tokens per KV block for this model
	MaxTokens    int           // requested output limit; 0 unknown
	SLO          time.Duration // per-request TTFT objective (x-slo-ttft-ms); 0 none
	Degraded     string        // why routing information is missing ("" = full information)
	Now          time.Time
}

// Prediction is a predicted TTFT and its terms, all in seconds of wall time.
// TTFT = Queue + Prefill + Overhead.
type Prediction struct {
	TTFT     time.Duration
	Queue    time.Duration // waiting behind prefill work and decode interference already on the worker
	Prefill  time.Duration // prefilling this request's uncached tokens
	Overhead time.Duration // fixed per-request time
}

// Pick reasons (the values of Decision.Reason for kvroute's own policy).
const (
	ReasonBest     = "best"     // lowest predicted TTFT, clear winner
	ReasonTie      = "tie"      // near-tie broken by fewest in-flight tokens, then at random
	ReasonSLO      = "slo"      // chosen among workers predicted to meet the request's SLO
	ReasonDegraded = "degraded" // no token information: load only
	ReasonPolicy   = "policy"   // a baseline policy's own choice
)

// Decision is a policy's answer.
type Decision struct {
	Index       int          // index into the candidates; -1 when Shed
	Reason      string       // one of the Reason constants
	Predictions []Prediction // one per candidate when the policy predicts; may be nil
	Shed        bool         // refuse the request (429): even the best prediction is too slow
	RetryAfter  time.Duration
}

// Policy chooses a worker. Pick is never called concurrently with itself (the router
// serializes it) and must not block; cands is non-empty and sorted by worker name.
type Policy interface {
	Name() string
	Pick(in *Input, cands []Candidate) Decision
}

// Observation is what happened to one routed request, handed back for learning.
type Observation struct {
	Worker       string
	PromptTokens int
	CachedTokens int    // what the index predicted at pick time
	Booked       Booked // the worker's bookings at pick time (this request excluded)
	Load         workers.Load
	Predicted    Prediction    // zero if the policy does not predict
	TTFT         time.Duration // observed time to first token; 0 when not observed
	E2E          time.Duration // observed end-to-end latency; 0 when not finished
	Usage        response.Usage
	Status       int // upstream HTTP status; 0 unknown
}

// Learner is implemented by policies that learn from observations. Observe may be
// called concurrently with Pick and with itself.
type Learner interface {
	Observe(o Observation)
}

// Simple is a fixed-coefficient TTFT predictor: no learning. It is the router core's
// built-in default until the learning predictor replaces it.
//
//	Queue   = (queued prefill tokens) / prefill rate  +  decoding requests × decode step share
//	Prefill = (PromptTokens − CachedTokens) / prefill rate
//	TTFT    = Queue + Prefill + Overhead
type Simple struct {
	PrefillTokensPerSecond float64 // default when a worker's profile has none
	Overhead               time.Duration
	Rand                   *rand.Rand
}

// Name implements Policy.
func (s *Simple) Name() string { return "simple" }

// Predict returns the prediction for one candidate.
func (s *Simple) Predict(in *Input, c *Candidate) Prediction {
	rate := c.Worker.Profile.PrefillTokensPerSecond
	if rate <= 0 {
		rate = s.PrefillTokensPerSecond
	}
	if rate <= 0 {
		rate = 5000
	}
	over := c.Worker.Profile.Overhead
	if over == 0 {
		over = s.Overhead
	}
	queued := float64(c.Booked.PrefillTokens)
	// A worker's own waiting queue beyond our bookings counts as average-sized prompts.
	if extra := c.Load.Waiting - float64(c.Booked.Prefilling); extra > 0 && in.PromptTokens > 0 {
		queued += extra * float64(in.PromptTokens)
	}
	q := time.Duration(queued / rate * float64(time.Second))
	p := time.Duration(float64(max(in.PromptTokens-c.CachedTokens, 0)) / rate * float64(time.Second))
	return Prediction{TTFT: q + p + over, Queue: q, Prefill: p, Overhead: over}
}

// Pick implements Policy: lowest predicted TTFT, near-ties (within 1%) broken by fewest
// booked prefill tokens, then at random.
func (s *Simple) Pick(in *Input, cands []Candidate) Decision {
	preds := make([]Prediction, len(cands))
	best := 0
	for i := range cands {
		preds[i] = s.Predict(in, &cands[i])
		if preds[i].TTFT < preds[best].TTFT {
			best = i
		}
	}
	margin := preds[best].TTFT / 100
	var ties []int
	for i := range cands {
		if preds[i].TTFT <= preds[best].TTFT+margin {
			ties = append(ties, i)
		}
	}
	reason := ReasonBest
	if in.Degraded != "" {
		reason = ReasonDegraded
	}
	if len(ties) > 1 {
		if reason == ReasonBest {
			reason = ReasonTie
		}
		least := ties[:0:0]
		minTok := -1
		for _, i := range ties {
			t := cands[i].Booked.PrefillTokens + cands[i].Booked.Requests
			switch {
			case minTok < 0 || t < minTok:
				minTok, least = t, append(least[:0], i)
			case t == minTok:
				least = append(least, i)
			}
		}
		best = least[0]
		if len(least) > 1 {
			if s.Rand != nil {
				best = least[s.Rand.IntN(len(least))]
			} else {
				best = least[rand.IntN(len(least))]
			}
		}
	}
	return Decision{Index: best, Reason: reason, Predictions: preds}
}

// Options are the settings every policy constructor receives.
type Options struct {
	PrefillTokensPerSecond float64       // default prefill rate for workers without a profile
	Overhead               time.Duration // default fixed per-request time
	Rand                   *rand.Rand    // nil: a randomly seeded source; tests and simulations inject a seeded one
}

// PolicyNames lists the names New accepts (scoring.policy values).
var PolicyNames = []string{"kvroute"}

// New returns the policy named name.
func New(name string, o Options) (Policy, error) {
	switch name {
	case "kvroute":
		return &Simple{PrefillTokensPerSecond: o.PrefillTokensPerSecond, Overhead: o.Overhead, Rand: o.Rand}, nil
	}
	return nil, fmt.Errorf("scoring: unknown policy %q (one of %v)", name, PolicyNames)
}
