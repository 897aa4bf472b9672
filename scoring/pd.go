package scoring

import (
	"time"

	"github.com/kvroute/kvroute/workers"
)

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

// transfer is the time from the end of a remote prefill to the decode worker c's first
// step with the request, seconds of wall time (saturating at MaxPredictedTerm):
//
//	KVTransferLatency + (P − C_c) × B ÷ BW + overhead_c + R_c × DecodeInterference
//
// P the prompt tokens, C_c the prefix c already caches (vLLM's NixlConnector reads only
// the blocks the decode worker lacks: get_num_new_matched_tokens counts from its local
// hit), B the model's KV bytes per token (Input.KVBytesPerToken, else
// Options.KVBytesPerToken), BW TransferBandwidth (Options.KVTransferBytesPerSecond, or
// learned: ObserveTransfer); then c schedules it as
// any request (its prior overhead) in a step that carries its R_c running sequences
// (the decode-interference prior per sequence, model.go).
func (p *Predictor) transfer(in *Input, c *Candidate) time.Duration {
	bpt := in.KVBytesPerToken
	if !(bpt > 0) {
		bpt = p.o.KVBytesPerToken
	}
	moved := float64(max(in.PromptTokens-max(c.CachedTokens, 0), 0))
	running := float64(max(c.Booked.Decoding, 0))
	if w := loadWeight(c.Load.ScrapedAt, in.Now, p.o.LoadHalfLife); w > 0 {
		running = max(running, w*c.Load.Running)
	}
	pr := priorFor(&p.o, c)
	s := p.o.KVTransferLatency.Seconds() + moved*bpt/p.TransferBandwidth() + pr.overhead + running*pr.decodePerStep
	return satDuration(s)
}

// TransferLearner is a policy that learns the prefill→decode transfer from observed
// transfers (the router reports each remote prefill whose end and decode first token
// it saw).
type TransferLearner interface {
	// ObserveTransfer reports one transfer: moved tokens of KV at bytesPerToken bytes
	// each (≤ 0: the policy's default), observed from the prefill leg's end to the
	// decode worker's first token, against the predicted transfer (Prediction.Transfer).
	ObserveTransfer(moved int, bytesPerToken float64, observed, predicted time.Duration)
}

// TransferBandwidth is the transfer bandwidth the predictor uses now, bytes per second:
// Options.KVTransferBytesPerSecond, or what ObserveTransfer learned.
func (p *Predictor) TransferBandwidth() float64 {
	if p.o.KVTransferLearnWeight <= 0 {
		return p.o.KVTransferBytesPerSecond
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.bw > 0 {
		return p.bw
	}
	return p.o.KVTransferBytesPerSecond
}

// ObserveTransfer implements TransferLearner: with Options.KVTransferLearnWeight w > 0,
// the observed wire time is the observed transfer less the prediction's terms other
// than bytes ÷ bandwidth (latency, the decode worker's overhead and its running
// sequences' step: predicted − B ÷ BW), and the bandwidth in use moves as an EWMA,
//
//	BW ← (1 − w) · BW + w · clamp(B ÷ wire, BW₀ ÷ 8, BW₀ × 8)
//
// BW₀ the configured bandwidth, B = moved × bytesPerToken. A transfer of no bytes, or
// whose wire time is not positive (the other terms were over-predicted), teaches
// nothing.
func (p *Predictor) ObserveTransfer(moved int, bytesPerToken float64, observed, predicted time.Duration) {
	w := p.o.KVTransferLearnWeight
	if w <= 0 || moved <= 0 || observed <= 0 {
		return
	}
	if !(bytesPerToken > 0) {
		bytesPerToken = p.o.KVBytesPerToken
	}
	b := float64(moved) * bytesPerToken
	bw0 := p.o.KVTransferBytesPerSecond
	p.mu.Lock()
	defer p.mu.Unlock()
	bw := p.bw
	if bw <= 0 {
		bw = bw0
	}
	wire := observed.Seconds() - max(predicted.Seconds()-b/bw, 0)
	if !(wire > 0) {
		return
	}
	p.bw = (1-min(w, 1))*bw + min(w, 1)*min(max(b/wire, bw0/8), bw0*8)
}

// kvLoad is the decode worker c's KV footprint with the request, as a fraction of its
// capacity (Profile.BlockCapacity × block size; tokens when unknown), and whether it
// fits: its booked footprint (Booked.KVTokens) or its scraped usage, whichever is
// larger, plus the request's prompt and requested output.
func kvLoad(in *Input, c *Candidate) (load float64, fits bool) {
	need := float64(max(in.PromptTokens, 0) + max(in.MaxTokens, 0))
	held := float64(max(c.Booked.KVTokens, 0))
	capTok := 0.0
	if c.Worker != nil && in.BlockSize > 0 {
		capTok = float64(c.Worker.Profile.BlockCapacity) * float64(in.BlockSize)
	}
	if capTok <= 0 {
		return held + need, true
	}
	if !c.Load.ScrapedAt.IsZero() {
		held = max(held, min(max(c.Load.KVUsage, 0), 1)*capTok)
	}
	return (held + need) / capTok, held+need <= capTok
}

// PickPair implements PairPicker: the pair pick of a disaggregated pool (docs/pd.md).
//
//  1. Every candidate is predicted and priced as in Pick (score): its TTFT were it to
//     prefill the request, plus the delay that prefill imposes on later requests.
//  2. The remote prefill worker is the cheapest prefill-capable worker (prefill, both)
//     by that cost, chosen as Pick chooses (choose: near-ties by least prefill work,
//     booked tokens, writes, then at random); for a both-role decode worker, the
//     cheapest other one.
//  3. Each worker that may answer (every role but prefill) gets its better option:
//     local (its own prediction and cost) or remote (the prefill worker's, plus the
//     transfer to it, p.transfer; only decode and both workers receive KV). A
//     decode-role worker prefills locally only an uncached prompt of at most
//     Options.PDMaxLocalPrefillTokens — Dynamo's conditional disaggregation, with the
//     prediction deciding below the cap (a short prompt, a long prefill queue).
//  4. Admission: the request is refused exactly as Pick refuses it (refusal: MaxTTFT,
//     the router's calibrated SLO threshold Input.RefuseAbove, ShedOnSLOMiss), on the
//     answering workers' best options — the pair's TTFT, transfer included.
//  5. The decode worker is the cheapest option within the near-tie margin, ties
//     broken by decode load: a worker where the request's KV fits first, then the
//     lowest KV footprint as a fraction of capacity (kvLoad), then fewest decoding,
//     then at random.
//
// Decision.Predictions holds each answering candidate's best option (a prefill-only
// one its own prediction). The policy's state records the prefill on the worker that
// runs it.
func (p *Predictor) PickPair(in *Input, cands []Candidate) PairDecision {
	sc := p.score(in, cands)
	pre := p.choosePrefill(in, cands, &sc, -1)
	n := len(cands)
	opt := make([]time.Duration, n)  // the option's cost
	preds := make([]Prediction, n)   // the option's prediction
	from := make([]int, n)           // the option's prefill worker; -1 local
	xfer := make([]time.Duration, n) // the transfer of a remote option
	var answer []int
	for i := range cands {
		preds[i], from[i], opt[i] = sc.preds[i], -1, sc.cost[i]
		role := cands[i].Worker.Role
		if !role.Decodes() {
			continue
		}
		answer = append(answer, i)
		if !role.ReceivesKV() {
			continue // aggregated: local only
		}
		q := pre.Index
		if q == i {
			q = p.choosePrefill(in, cands, &sc, i).Index
		}
		if q < 0 || q == i {
			continue
		}
		x := p.transfer(in, &cands[i])
		rc := sc.cost[q] + x
		uncached := max(in.PromptTokens-max(cands[i].CachedTokens, 0), 0)
		capped := role == workers.RoleDecode && p.o.PDMaxLocalPrefillTokens >= 0 && uncached > p.o.PDMaxLocalPrefillTokens
		if capped || rc < opt[i] {
			pp := sc.preds[q]
			pp.Transfer = x
			pp.TTFT += x
			preds[i], from[i], opt[i], xfer[i] = pp, q, rc, x
		}
	}
	if len(answer) == 0 {
		return PairDecision{Decision: Decision{Index: -1, Reason: ReasonBest}, Prefill: -1}
	}
	// Admission: the aggregated pick's refusal rule (refusal), on the options a request
	// could actually be sent to.
	options := make([]Prediction, len(answer))
	for j, i := range answer {
		options[j] = preds[i]
	}
	if d, refused := refusal(&p.o, in, options); refused {
		d.Predictions = preds
		p.commit(in, cands, d, &sc)
		return PairDecision{Decision: d, Prefill: -1}
	}
	best := answer[0]
	for _, i := range answer[1:] {
		if opt[i] < opt[best] {
			best = i
		}
	}
	margin := max(time.Duration(float64(opt[best])*p.o.TieMargin), p.o.TieMarginMin)
	var ties []int
	for _, i := range answer {
		if opt[i] <= opt[best]+margin {
			ties = append(ties, i)
		}
	}
	reason := ReasonBest
	if len(ties) > 1 {
		reason = ReasonTie
	}
	if in.Degraded != "" || in.PromptTokens <= 0 {
		reason = ReasonDegraded
	}
	d := p.breakDecodeTie(in, cands, ties)
	out := PairDecision{Decision: Decision{Index: d, Reason: reason, Predictions: preds}, Prefill: from[d], Predicted: preds[d]}
	runs := d // the worker that prefills
	if q := from[d]; q >= 0 {
		out.PrefillPredicted, runs = sc.preds[q], q
	}
	p.commit(in, cands, Decision{Index: runs, Reason: reason, Predictions: sc.preds}, &sc)
	return out
}

// choosePrefill is Pick's placement (place: the pair is admitted or refused on its
// options, not on the prefill leg alone) among the prefill-capable candidates other
// than skip (−1 none); Index −1 when there are none.
func (p *Predictor) choosePrefill(in *Input, cands []Candidate, sc *scored, skip int) Decision {
	var idx []int
	for i := range cands {
		if i != skip && cands[i].Worker.Role.Prefills() {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return Decision{Index: -1}
	}
	sub := make([]Candidate, len(idx))
	preds, cost, st, writes := make([]Prediction, len(idx)), make([]time.Duration, len(idx)), make([]candState, len(idx)), make([]float64, len(idx))
	for j, i := range idx {
		sub[j], preds[j], cost[j], st[j], writes[j] = cands[i], sc.preds[i], sc.cost[i], sc.st[i], sc.writes[i]
	}
	d := place(&p.o, sc.sc, in, sub, preds, cost, st, writes)
	d.Index = idx[d.Index]
	return d
}

// breakDecodeTie returns one of idx by decode load: the request's KV fits, then the
// lowest KV footprint fraction (kvLoad), then fewest decoding, then at random.
func (p *Predictor) breakDecodeTie(in *Input, cands []Candidate, idx []int) int {
	if len(idx) == 1 {
		return idx[0]
	}
	load := make([]float64, len(cands))
	fit := make([]bool, len(cands))
	anyFit := false
	for _, i := range idx {
		load[i], fit[i] = kvLoad(in, &cands[i])
		anyFit = anyFit || fit[i]
	}
	out := idx[:0:0]
	for _, i := range idx {
		if fit[i] || !anyFit {
			out = append(out, i)
		}
	}
	low := out[0]
	for _, i := range out {
		if load[i] < load[low] {
			low = i
		}
	}
	// loads within 1 % of the capacity (or 1 % of the tokens) are equal
	eps := max(load[low]*0.01, 0.01)
	var near []int
	for _, i := range out {
		if load[i] <= load[low]+eps {
			near = append(near, i)
		}
	}
	near = minBy(near, func(i int) int { return cands[i].Booked.Decoding })
	if len(near) == 1 {
		return near[0]
	}
	return near[p.o.Rand.IntN(len(near))]
}
