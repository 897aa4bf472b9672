package scoring

import (
	"math/rand/v2"
	"sync"
	"time"
)

// Simple is the predicted-TTFT policy with fixed prior coefficients and no metrics. Its
// zero value is usable (every Options default); it is the router core's built-in
// default when no policy is configured. New("kvroute_static", …) is the configurable
// equivalent.
type Simple struct {
	PrefillTokensPerSecond float64       // 0 → 5000
	Overhead               time.Duration // 0 → 20 ms
	Rand                   *rand.Rand    // nil → randomly seeded

	once sync.Once
	p    *Predictor
}

func (s *Simple) predictor() *Predictor {
	s.once.Do(func() {
		s.p = NewPredictor(Options{PrefillTokensPerSecond: s.PrefillTokensPerSecond, Overhead: s.Overhead, Rand: s.Rand}, false)
	})
	return s.p
}

// Name implements Policy.
func (s *Simple) Name() string { return "simple" }

// Predict returns the prediction for one candidate.
func (s *Simple) Predict(in *Input, c *Candidate) Prediction { return s.predictor().Predict(in, c) }

// Pick implements Policy.
func (s *Simple) Pick(in *Input, cands []Candidate) Decision { return s.predictor().Pick(in, cands) }
