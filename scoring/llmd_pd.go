package scoring

import (
	"math/rand/v2"

	"github.com/kvroute/kvroute/metrics"
)

// LLMDPD re-implements llm-d's prefill/decode profile handler (llm-d-inference-scheduler
// pkg/plugins/profile/pd_profile_handler.go with prefix_based_pd_decider.go) as a
// PairPicker, for comparison:
//
//  1. The decode profile runs first, over the workers that may answer (decode, both,
//     aggregated): score = GIEPrefixWeight·prefix + GIEQueueWeight·queue +
//     GIEKVWeight·KV, with prefix = the worker's cached prefix ÷ the prompt (the
//     precise, KV-event index: llm-d's precise-prefix-cache-scorer), queue =
//     (max−q)/(max−min) over the profile's waiting queues (vllm:num_requests_waiting
//     as scraped, else the requests booked and not yet prefilled; 1 when all equal),
//     KV = 1 − KV-cache usage; highest wins, ties at random.
//  2. The decider: when the uncached prompt on that decode worker is at least
//     Baselines.PDNonCachedTokens (nonCachedTokens; negative: always) and it receives
//     KV (decode, both), the prefill profile runs over the prefill-capable workers
//     (prefill, both) other than it, with the same scorers; else the decode worker
//     prefills itself.
//
// There is no prediction: no transfer cost, no conditional choice by queue.
type LLMDPD struct {
	b   Baselines
	rng *rand.Rand
	m   *metrics.Scoring
}

func newLLMDPD(o Options) *LLMDPD { return &LLMDPD{b: o.Baselines, rng: o.Rand, m: o.Metrics} }

// Name implements Policy.
func (p *LLMDPD) Name() string { return PolicyLLMDPD }

// Pick implements Policy: the decode profile over every candidate (an aggregated pool).
func (p *LLMDPD) Pick(in *Input, cands []Candidate) Decision {
	countPick(p.m, in, PolicyLLMDPD)
	idx := make([]int, len(cands))
	for i := range idx {
		idx[i] = i
	}
	return Decision{Index: p.profile(in, cands, idx), Reason: ReasonPolicy}
}

// PickPair implements PairPicker.
func (p *LLMDPD) PickPair(in *Input, cands []Candidate) PairDecision {
	countPick(p.m, in, PolicyLLMDPD)
	var dec, pre []int
	for i := range cands {
		if cands[i].Worker.Role.Decodes() {
			dec = append(dec, i)
		}
	}
	if len(dec) == 0 {
		return PairDecision{Decision: Decision{Index: -1, Reason: ReasonPolicy}, Prefill: -1}
	}
	d := p.profile(in, cands, dec)
	out := PairDecision{Decision: Decision{Index: d, Reason: ReasonPolicy}, Prefill: -1}
	uncached := max(in.PromptTokens-max(cands[d].CachedTokens, 0), 0)
	if !cands[d].Worker.Role.ReceivesKV() || (p.b.PDNonCachedTokens >= 0 && uncached < p.b.PDNonCachedTokens) {
		return out
	}
	for i := range cands {
		if i != d && cands[i].Worker.Role.Prefills() {
			pre = append(pre, i)
		}
	}
	if len(pre) > 0 {
		out.Prefill = p.profile(in, cands, pre)
	}
	return out
}

// profile runs one scheduling profile (prefix, queue and KV-cache scorers, max-score
// picker) over cands[idx] and returns the winner's index into cands.
func (p *LLMDPD) profile(in *Input, cands []Candidate, idx []int) int {
	q := make([]float64, len(idx))
	minQ, maxQ := 0.0, 0.0
	for j, i := range idx {
		c := &cands[i]
		if !c.Load.ScrapedAt.IsZero() {
			q[j] = c.Load.Waiting
		} else {
			q[j] = float64(c.Booked.Prefilling)
		}
		if j == 0 || q[j] < minQ {
			minQ = q[j]
		}
		if j == 0 || q[j] > maxQ {
			maxQ = q[j]
		}
	}
	j := minRandom(p.rng, len(idx), func(j int) float64 {
		c := &cands[idx[j]]
		prefix := 0.0
		if in.PromptTokens > 0 {
			prefix = float64(max(c.CachedTokens, 0)) / float64(in.PromptTokens)
		}
		queue := 1.0
		if maxQ > minQ {
			queue = (maxQ - q[j]) / (maxQ - minQ)
		}
		kv := 1 - min(max(c.Load.KVUsage, 0), 1)
		return -(p.b.GIEPrefixWeight*prefix + p.b.GIEQueueWeight*queue + p.b.GIEKVWeight*kv)
	})
	return idx[j]
}
