package router

import (
	"math"
	"sync"
	"time"
)

// SLO refusal calibration. A request refused on its prediction (PickOptions
// RefuseOnSLOMiss) is refused when the best worker's predicted TTFT, times a margin m,
// is past its objective. The predictor's error grows with load (queues it sees only
// through a scrape, prefill chunks interleaving with decodes), so m is learned from the
// requests that were admitted under the rule: each one's observed TTFT against its
// objective moves m by stochastic approximation of a quantile (Robbins & Monro, 1951):
//
//	m ← clamp(m · exp(η · (1[TTFT > SLO] − α)), mMin, mMax)
//
// whose fixed point is the margin at which a fraction α of admitted requests miss:
// with α = 0.1 their p90 TTFT sits at the objective. Refused requests give no
// feedback; m falls back by η·α per admitted request that meets its objective, so
// after a burst it returns to the quiet level within a few hundred requests.
const (
	sloMissTarget = 0.10 // α: the share of admitted requests allowed to miss
	sloMarginStep = 0.05 // η
	sloMarginMin  = 0.5
	sloMarginMax  = 8.0
)

type sloMargin struct {
	mu sync.Mutex
	m  float64
}

// get returns the current margin (1 before any feedback).
func (s *sloMargin) get() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == 0 {
		return 1
	}
	return s.m
}

// observe folds one admitted request's outcome in.
func (s *sloMargin) observe(ttft, slo time.Duration) {
	miss := 0.0
	if ttft > slo {
		miss = 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == 0 {
		s.m = 1
	}
	s.m = min(max(s.m*math.Exp(sloMarginStep*(miss-sloMissTarget)), sloMarginMin), sloMarginMax)
}

// SLOMargin is the margin the refusal rule applies to predictions now (1 = the
// predictor as is; 1.5 = a request is refused when 1.5 × its best prediction is past
// its objective).
func (r *Router) SLOMargin() float64 { return r.sloMargin.get() }
