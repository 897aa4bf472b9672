package scoring

import (
	"math/rand/v2"

	"github.com/kvroute/kvroute/metrics"
)

// LLMD re-implements llm-d's "prefix affinity until saturated" routing from its
// documentation (not its code): the blog "Sticky Until Saturated: Token-Aware Routing in
// llm-d" (https://llm-d.ai/blog/sticky-until-saturated-token-aware-routing) and the
// precise prefix-cache routing guide
// (https://llm-d.ai/docs/dev/guides/precise-prefix-cache-routing).
//
//  1. Prefix affinity uses the precise, KV-event-driven index (Candidate.CachedTokens).
//  2. A worker is saturated when its in-flight uncached prefill tokens reach
//     SaturationTokens (token-aware load), or its scraped waiting queue reaches
//     SaturationQueue, or its KV-cache usage reaches SaturationKV (the saturation
//     detector's queue-depth and KV-utilization thresholds).
//  3. Among unsaturated workers holding a prefix, stick to the longest prefix (ties:
//     least token load, then random). With none, the least token-loaded unsaturated
//     worker; when all are saturated, the least token-loaded worker.
type LLMD struct {
	b   Baselines
	rng *rand.Rand
	m   *metrics.Scoring
}

func newLLMD(o Options) *LLMD { return &LLMD{b: o.Baselines, rng: o.Rand, m: o.Metrics} }

// Name implements Policy.
func (p *LLMD) Name() string { return PolicyLLMD }

func (p *LLMD) saturated(c *Candidate) bool {
	if c.Booked.PrefillTokens >= p.b.SaturationTokens {
		return true
	}
	return !c.Load.ScrapedAt.IsZero() && (c.Load.Waiting >= p.b.SaturationQueue || c.Load.KVUsage >= p.b.SaturationKV)
}

// Pick implements Policy.
func (p *LLMD) Pick(in *Input, cands []Candidate) Decision {
	countPick(p.m, in, PolicyLLMD)
	const inf = 1e300
	sat := make([]bool, len(cands))
	anyFree, anyHit := false, false
	for i := range cands {
		sat[i] = p.saturated(&cands[i])
		anyFree = anyFree || !sat[i]
		anyHit = anyHit || (!sat[i] && cands[i].CachedTokens > 0)
	}
	load := func(i int) float64 { return float64(cands[i].Booked.PrefillTokens) }
	if anyHit {
		// Longest prefix first; the token load breaks ties (scaled below one token).
		return Decision{Index: minRandom(p.rng, len(cands), func(i int) float64 {
			if sat[i] || cands[i].CachedTokens <= 0 {
				return inf
			}
			return -float64(cands[i].CachedTokens) + load(i)/(load(i)+1)
		}), Reason: ReasonPolicy}
	}
	return Decision{Index: minRandom(p.rng, len(cands), func(i int) float64 {
		if anyFree && sat[i] {
			return inf
		}
		return load(i)
	}), Reason: ReasonPolicy}
}
