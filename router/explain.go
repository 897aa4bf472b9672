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
	Decision   scoring.Decision
	Path       tokenize.Path
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
	d := r.opt.Policy.Pick(&in.Input, cands)
	return &Explanation{Input: &in.Input, Candidates: cands, Decision: d, Path: in.path}, nil
}
