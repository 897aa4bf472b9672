package scoring

import (
	"math/rand/v2"
	"sync/atomic"

	"github.com/kvroute/kvroute/metrics"
)

// countPick records a baseline's decision (not for explain dry-runs).
func countPick(m *metrics.Scoring, in *Input, policy string) {
	if m != nil && !in.DryRun {
		m.Picks.WithLabelValues(policy, ReasonPolicy).Inc()
	}
}

// Random picks uniformly at random: the floor every other policy must beat.
type Random struct {
	rng *rand.Rand
	m   *metrics.Scoring
}

// Name implements Policy.
func (p *Random) Name() string { return PolicyRandom }

// Pick implements Policy.
func (p *Random) Pick(in *Input, cands []Candidate) Decision {
	countPick(p.m, in, PolicyRandom)
	return Decision{Index: p.rng.IntN(len(cands)), Reason: ReasonPolicy}
}

// RoundRobin cycles through the candidates in name order (Envoy ROUND_ROBIN, Dynamo's
// default --router-mode round-robin). The counter advances once per real pick.
type RoundRobin struct {
	next atomic.Uint64
	m    *metrics.Scoring
}

// Name implements Policy.
func (p *RoundRobin) Name() string { return PolicyRoundRobin }

// Pick implements Policy.
func (p *RoundRobin) Pick(in *Input, cands []Candidate) Decision {
	n := p.next.Load()
	if !in.DryRun {
		n = p.next.Add(1) - 1
	}
	countPick(p.m, in, PolicyRoundRobin)
	return Decision{Index: int(n % uint64(len(cands))), Reason: ReasonPolicy}
}

// LeastRequest picks the worker with the fewest requests kvroute has in flight on it
// (Envoy LEAST_REQUEST with a full scan; ties at random).
type LeastRequest struct {
	rng *rand.Rand
	m   *metrics.Scoring
}

// Name implements Policy.
func (p *LeastRequest) Name() string { return PolicyLeastRequest }

// Pick implements Policy.
func (p *LeastRequest) Pick(in *Input, cands []Candidate) Decision {
	countPick(p.m, in, PolicyLeastRequest)
	return Decision{Index: minRandom(p.rng, len(cands), func(i int) float64 { return float64(cands[i].Booked.Requests) }), Reason: ReasonPolicy}
}

// minRandom returns the index in [0,n) with the smallest key, ties uniformly at random.
func minRandom(rng *rand.Rand, n int, key func(int) float64) int {
	best, count := -1, 0
	var bk float64
	for i := 0; i < n; i++ {
		k := key(i)
		switch {
		case best < 0 || k < bk:
			best, bk, count = i, k, 1
		case k == bk:
			count++
			if rng.IntN(count) == 0 { // reservoir sampling: uniform among equals
				best = i
			}
		}
	}
	return best
}
