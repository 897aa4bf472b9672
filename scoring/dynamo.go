package scoring

import (
	"math"
	"math/rand/v2"

	"github.com/kvroute/kvroute/metrics"
)

// Dynamo re-implements NVIDIA Dynamo's KV router cost from its documentation (not its
// code): https://docs.nvidia.com/dynamo/latest/router/kv_cache_routing.html ("Cost
// Calculation") and https://docs.nvidia.com/dynamo/latest/router/README.html.
//
//	prefill_blocks_i = (active prompt tokens on i + request tokens − overlap_i·block) / block
//	decode_blocks_i  = active KV blocks of i's sequences + the request's blocks
//	cost_i           = kv_overlap_score_weight · prefill_blocks_i + decode_blocks_i
//
// The lowest cost wins (ties at random); with router_temperature T > 0 the worker is
// sampled with probability ∝ exp(−cost_i/(T·max cost)) (softmax over normalized logits).
// Dynamo counts each worker's active blocks exactly; kvroute's bookings know requests,
// not their lengths, so active blocks are estimated as booked requests × the mean
// prompt blocks of recent requests (plus prefill blocks still booked).
type Dynamo struct {
	b   Baselines
	rng *rand.Rand
	m   *metrics.Scoring

	meanBlocks float64 // EWMA of request prompt blocks; touched only in Pick (serialized)
}

func newDynamo(o Options) *Dynamo { return &Dynamo{b: o.Baselines, rng: o.Rand, m: o.Metrics} }

// Name implements Policy.
func (p *Dynamo) Name() string { return PolicyDynamo }

// Pick implements Policy.
func (p *Dynamo) Pick(in *Input, cands []Candidate) Decision {
	countPick(p.m, in, PolicyDynamo)
	bs := float64(max(in.BlockSize, 1))
	req := math.Ceil(float64(max(in.PromptTokens, 0)) / bs)
	mean := p.meanBlocks
	if mean == 0 {
		mean = req
	}
	cost := make([]float64, len(cands))
	maxCost := 0.0
	for i := range cands {
		c := &cands[i]
		overlap := min(float64(c.Cached.Blocks), req)
		prefill := float64(max(c.Booked.PrefillTokens, 0))/bs + req - overlap
		decode := float64(max(c.Booked.Requests, 0))*mean + req
		cost[i] = p.b.DynamoOverlap*prefill + decode
		maxCost = max(maxCost, cost[i])
	}
	if !in.DryRun && req > 0 {
		if p.meanBlocks == 0 {
			p.meanBlocks = req
		} else {
			p.meanBlocks += 0.05 * (req - p.meanBlocks)
		}
	}
	if t := p.b.DynamoTemperature; t > 0 && maxCost > 0 {
		w := make([]float64, len(cands))
		sum := 0.0
		for i := range cost {
			w[i] = math.Exp(-cost[i] / maxCost / t)
			sum += w[i]
		}
		r := p.rng.Float64() * sum
		for i := range w {
			if r -= w[i]; r < 0 {
				return Decision{Index: i, Reason: ReasonPolicy}
			}
		}
		return Decision{Index: len(w) - 1, Reason: ReasonPolicy}
	}
	return Decision{Index: minRandom(p.rng, len(cands), func(i int) float64 { return cost[i] }), Reason: ReasonPolicy}
}
