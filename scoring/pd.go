package scoring

// PairPicker is a policy that chooses prefill/decode pairs itself on a pool whose
// workers have prefill/decode roles (workers.Role). The router calls PickPair instead of
// Pick when any candidate has a role other than both, under the same rules as Pick
// (never concurrently with itself or Pick, must not block; cands non-empty and sorted
// by worker name). A policy without it gets the router's plain pair pick (its Pick
// among the workers that may prefill, then the least-loaded decode worker).
type PairPicker interface {
	PickPair(in *Input, cands []Candidate) PairDecision
}

// PairDecision is a PairPicker's answer. Decision.Index is the decode worker (the one
// that answers the request); Decision.Predictions, when set, has one entry per candidate:
// its predicted TTFT as that request's decode worker with its best prefill choice.
type PairDecision struct {
	Decision
	// Prefill is the index of the worker that prefills for Index; -1 when Index prefills
	// locally (an aggregated worker, or the conditional choice that a remote prefill
	// would be slower).
	Prefill int
	// Predicted is the chosen pair's prediction: Prefill's queue, prefill and overhead,
	// plus Transfer (0 for a local prefill, where it is Index's own prediction).
	Predicted Prediction
	// PrefillPredicted is the prefill worker's own prediction for the prefill leg (its
	// TTFT for the request sent with max_tokens 1); zero for a local prefill. The
	// prefill leg's observed duration teaches the policy against it.
	PrefillPredicted Prediction
}
