package bench

import (
	"math/rand/v2"

	"github.com/kvroute/kvroute/scoring"
)

// clientPolicies are the baselines kvbench can apply itself: client-side routing over
// HTTP, and a fallback for virtual runs when the scoring package does not (yet) have a
// policy of that name.
var clientPolicies = []string{"random", "round_robin"}

// newPolicy returns scoring's policy of that name, or bench's own random/round_robin.
// batchTokens is the simulated engines' max_num_batched_tokens, what an operator sets
// scoring.batch_tokens to (0: scoring's default); peerState sets scoring.Options.PeerState
// (scoring.peer_state), cacheTurnover scoring.Options.CacheTurnover (scoring.cache_turnover)
// and utilBacklog scoring.Options.UtilizationBacklog (scoring.utilization_backlog).
func newPolicy(name string, r *rand.Rand, batchTokens int, peerState, cacheTurnover, utilBacklog bool) (scoring.Policy, error) {
	p, err := scoring.New(name, scoring.Options{Rand: r, BatchTokens: batchTokens, PeerState: peerState, CacheTurnover: cacheTurnover, UtilizationBacklog: utilBacklog})
	if err == nil {
		return p, nil
	}
	switch name {
	case "random":
		return &randomPolicy{r: r}, nil
	case "round_robin":
		return &rrPolicy{}, nil
	}
	return nil, err
}

// PolicyNames returns scoring.PolicyNames plus bench's own baselines missing from it,
// less the adapter-affinity baseline (the same as llmd_prefix_affinity without adapters).
func PolicyNames() []string {
	var out []string
	for _, n := range scoring.PolicyNames {
		if n != scoring.PolicyLoRAAffinity && n != scoring.PolicyLLMDPD { // LoRA / P/D rows and workloads run them (LoRAPolicies, PDPolicies)
			out = append(out, n)
		}
	}
	for _, c := range clientPolicies {
		found := false
		for _, n := range out {
			found = found || n == c
		}
		if !found {
			out = append(out, c)
		}
	}
	return out
}

// randomPolicy picks uniformly at random (a Kubernetes Service with one pod per
// connection behaves like this).
type randomPolicy struct{ r *rand.Rand }

func (p *randomPolicy) Name() string { return "random" }
func (p *randomPolicy) Pick(_ *scoring.Input, c []scoring.Candidate) scoring.Decision {
	return scoring.Decision{Index: p.r.IntN(len(c)), Reason: scoring.ReasonPolicy}
}

// rrPolicy cycles through the candidates.
type rrPolicy struct{ n int }

func (p *rrPolicy) Name() string { return "round_robin" }
func (p *rrPolicy) Pick(_ *scoring.Input, c []scoring.Candidate) scoring.Decision {
	p.n++
	return scoring.Decision{Index: (p.n - 1) % len(c), Reason: scoring.ReasonPolicy}
}
