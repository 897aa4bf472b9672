package bench

import (
	"math/rand/v2"

	"github.com/kvroute/kvroute/scoring"
)

// clientPolicies are the baselines kvbench can apply itself: client-side routing over
// HTTP, and a fallback for virtual runs when the scoring package does not (yet) have a
// policy of that name.
var clientPolicies = []string{"random", "round_robin"}

// newPolicy returns scoring's policy of that name under o, or bench's own
// random/round_robin (which use o.Rand only). o.BatchTokens is the simulated engines'
// max_num_batched_tokens, what an operator sets scoring.batch_tokens to.
func newPolicy(name string, o scoring.Options) (scoring.Policy, error) {
	r := o.Rand
	p, err := scoring.New(name, o)
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

// scoringOptions are the scoring.Options a virtual run's policies get: the simulated
// engines' batch size and the switches VirtualOptions turns on.
func (o *VirtualOptions) scoringOptions(r *rand.Rand) scoring.Options {
	return scoring.Options{Rand: r, BatchTokens: o.Profile.MaxBatchTokens, PeerState: o.PeerState,
		CacheTurnover: o.CacheTurnover, UtilizationBacklog: o.UtilizationBacklog, KVWait: o.KVWait}
}
