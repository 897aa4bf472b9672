package router

import (
	"context"

	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
)

// Explanation is one worker's view of a request without booking anything.
type Explanation struct {
	Input      *scoring.Input
	Candidates []scoring.Candidate
	Decision   scoring.Decision // Decision.Index: the worker that answers (the decode worker of a pair)
	Path       tokenize.Path
	// Pair is the pair pick on a pool with prefill/decode roles (docs/pd.md): its
	// Prefill (−1: the decode worker prefills locally), the pair's prediction with its
	// Transfer; nil on an aggregated pool.
	Pair *scoring.PairDecision
}

// Explain computes what Pick would decide for req, without booking, speculating or
// changing policy state: it sets scoring.Input.DryRun, under which every policy decides
// as usual but does not advance round robin, update Dynamo's running mean, insert into
// GIE's LRU or SGLang's radix tree, log its decision or count metrics (scoring.go,
// baselines.go, dynamo.go, gie.go, sglang.go, kvroute.go). The one thing a dry run
// shares with a real pick is the injected random source: policies that draw from it
// (random, tie-breaks, Dynamo's temperature) consume draws, which shifts no
// distribution. Errors are *Error, as for Pick.
func (r *Router) Explain(ctx context.Context, req *request.Request, opt PickOptions) (*Explanation, error) {
	in, cands, err := r.prepare(ctx, req, opt, nil)
	if err != nil {
		return nil, err
	}
	in.DryRun = true // policies decide as usual but change no state and count nothing
	r.prepolicy(in, cands)
	r.mu.Lock()
	defer r.mu.Unlock()
	if cands = r.liveLocked(cands); len(cands) == 0 {
		return nil, r.noHealthy(req.Model)
	}
	for i := range cands {
		r.bookedLocked(&cands[i], in.Now, in.BlockSize)
	}
	pair := disaggregated(cands)
	if pair && !anyDecodes(cands) {
		return nil, r.noHealthy(req.Model)
	}
	pd := r.decideLocked(in, cands, pair)
	ex := &Explanation{Input: &in.Input, Candidates: cands, Decision: pd.Decision, Path: in.path}
	if pair {
		ex.Pair = &pd
	}
	return ex, nil
}
