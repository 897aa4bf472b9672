package scoring

import (
	"slices"

	"github.com/kvroute/kvroute/metrics"
)

// LoRAAffinity is the adapter-affinity routing of llm-d (the Gateway API Inference
// Extension's lora-affinity-scorer) and AIBrix (lora routing: the pods that have the
// adapter first), in front of llm-d's prefix affinity until saturated (LLMD).
//
// The affinity score reads the scraped vllm:lora_requests_info only, as the scorer
// does (pkg/epp/scheduling/framework/plugins/scorer/lora_affinity.go): 1.0 when the
// adapter is running there (active), 0.8 when running ∪ waiting adapters are fewer
// than max_lora (room to load one), 0.6 when it is waiting there, 0 otherwise. The
// unsaturated workers (LLMD's saturation detector) with the best score are kept — all
// workers when every one is saturated — and LLMD picks among them. Workers that export
// no LoRA state score 0.8 (nothing says they cannot load it).
type LoRAAffinity struct {
	llmd *LLMD
	m    *metrics.Scoring
}

func newLoRAAffinity(o Options) *LoRAAffinity {
	return &LoRAAffinity{llmd: &LLMD{b: o.Baselines, rng: o.Rand}, m: o.Metrics}
}

// Name implements Policy.
func (p *LoRAAffinity) Name() string { return PolicyLoRAAffinity }

// affinity is the lora-affinity-scorer's score of c for adapter.
func affinity(c *Candidate, adapter string) float64 {
	a := c.Load.Adapters
	if !a.Known() {
		return 0.8
	}
	union := len(a.Running)
	for _, n := range a.Waiting {
		if !slices.Contains(a.Running, n) {
			union++
		}
	}
	switch {
	case slices.Contains(a.Running, adapter):
		return 1
	case union < a.MaxLoRAs:
		return 0.8
	case slices.Contains(a.Waiting, adapter):
		return 0.6
	}
	return 0
}

// Pick implements Policy.
func (p *LoRAAffinity) Pick(in *Input, cands []Candidate) Decision {
	countPick(p.m, in, PolicyLoRAAffinity)
	if in.Adapter == "" {
		return p.llmd.Pick(in, cands)
	}
	anyFree := false
	for i := range cands {
		anyFree = anyFree || !p.llmd.saturated(&cands[i])
	}
	best := -1.0
	for i := range cands {
		if !anyFree || !p.llmd.saturated(&cands[i]) {
			best = max(best, affinity(&cands[i], in.Adapter))
		}
	}
	var keep []int
	for i := range cands {
		if (!anyFree || !p.llmd.saturated(&cands[i])) && affinity(&cands[i], in.Adapter) == best {
			keep = append(keep, i)
		}
	}
	sub := make([]Candidate, len(keep))
	for j, i := range keep {
		sub[j] = cands[i]
	}
	d := p.llmd.Pick(in, sub)
	d.Index = keep[d.Index]
	return d
}
