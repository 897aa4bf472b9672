package router

import (
	"context"
	"time"

	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// prefillLeg is a ticket's booking on its remote prefill worker (prefill/decode
// disaggregation; docs/pd.md). Guarded by Router.mu.
type prefillLeg struct {
	on        string             // the prefill worker holding the booking; "" none or released
	tokens    int                // booked uncached prefill tokens there
	booked    scoring.Booked     // its bookings before this one (learning feature)
	load      workers.Load       // its scraped load at pick time
	predicted scoring.Prediction // its own prediction for the prefill leg
	start     time.Time          // when the leg was sent: the pick, or the retry
	done      bool               // PrefillDone was called (or the first token came): the leg is over
	failed    bool               // the leg failed: the decode worker prefills locally
	retried   bool               // this leg is the retry of a failed one (RetryPrefill)
	endAt     time.Time          // PrefillDone(nil): when the KV was ready; zero unseen
}

// PrefillDone records the end of the remote prefill leg: the answer of PrefillAddress
// to the request sent with kv_transfer_params {"do_remote_decode": true} and
// max_tokens 1. err nil: it answered and its KV is ready for the decode worker; the
// prefill worker's booking is released and the leg's duration (Start to now) teaches
// the learning policy as the prefill worker's TTFT, against the prefill worker's own
// prediction. err non-nil (connect error, non-2xx, no kv_transfer_params): the ticket
// falls back to local prefill — the prefill worker's booking and speculative index
// entries are withdrawn, the decode worker's booking grows by the whole uncached prompt
// (its prefill tokens: PromptTokens − CachedTokens), RemotePrefill reports false from now
// on, and kvroute_router_pd_prefill_fallbacks_total counts it; the front then sends the
// request to Address without kv_transfer_params. Only the first call counts; a ticket
// without a remote prefill, one whose first token already came, or an ended one
// ignores it. Safe for concurrent use.
func (t *Ticket) PrefillDone(err error) {
	r := t.r
	now := r.opt.Now()
	r.mu.Lock()
	if t.PrefillWorker == "" || t.ended || t.pf.done || !t.firstAt.IsZero() {
		r.mu.Unlock()
		return
	}
	var obs scoring.Observation
	learn := false
	if err == nil {
		obs, learn = t.prefillObservationLocked(now)
		t.releasePrefillLocked(now)
		t.pf.endAt = now
	} else {
		t.releasePrefillLocked(now)
		t.pf.failed = true
		if f := r.flights[t.on]; f != nil {
			t.bookLocked(f, -1)
			t.prefill = max(t.PromptTokens-t.CachedTokens, 0)
			t.bookLocked(f, 1)
		} else {
			t.prefill = max(t.PromptTokens-t.CachedTokens, 0)
		}
	}
	r.mu.Unlock()
	if err != nil {
		r.withdrawPrefill(t)
		r.m.PDFallbacks.Inc()
	} else if l, ok := r.opt.Policy.(scoring.Learner); ok && learn {
		l.Observe(obs)
	}
	r.capacityFreed()
}

// RetryPrefill handles the failure err of t's prefill leg on PrefillWorker (the front's
// PrefillDone(err) in its place): it retries the leg once on another prefill worker when
// the pair pick predicts one worth it, else falls back to local prefill as
// PrefillDone(err) does. The retry's pick is the pair pick (decideLocked, the policy's
// PickPair when it has one) over t's decode worker and the healthy prefill-capable
// workers other than the failed one and the decode worker, these as prefill-only: so a
// retry is made exactly when the pick would have chosen that remote prefill over the
// decode worker's local one (faster as predicted, or an uncached prompt past
// scoring.pd_max_local_prefill_tokens), the decode worker unchanged. req is t's request
// (tokenized again, for the other workers' cached prefixes).
//
// true: the failed leg's booking and speculative index entries are released, the new
// leg is booked on the new PrefillWorker (PrefillAddress, PrefillCachedTokens change
// under the router's lock; the front that owns t reads them after this call), and the
// front sends the prefill leg there, ending it with PrefillDone. false: t prefills on
// its decode worker (RemotePrefill reports false; kvroute_router_pd_prefill_fallbacks_total
// counts it) — the retry was not worth it, no other prefill worker is healthy, this leg
// is itself a retry, or t has no open prefill leg (ended, first token come). Safe for
// concurrent use.
func (t *Ticket) RetryPrefill(ctx context.Context, req *request.Request, err error) bool {
	r := t.r
	r.mu.Lock()
	failed, decode, open := t.PrefillWorker, t.on, t.legOpenLocked() && !t.pf.retried
	r.mu.Unlock()
	if !open {
		t.PrefillDone(err)
		return false
	}
	in, cands, perr := r.prepare(ctx, req, PickOptions{RequestID: t.RequestID}, nil)
	if perr != nil {
		t.PrefillDone(err)
		return false
	}
	keep := cands[:0]
	for _, c := range cands {
		if c.Worker.Name == decode || c.Worker.Name != failed && c.Worker.Role.Prefills() {
			keep = append(keep, c)
		}
	}
	cands = keep
	r.prepolicy(in, cands)
	r.mu.Lock()
	if r.opt.Registry.Version() != in.regVersion {
		cands = r.liveLocked(cands)
	}
	var q *retryChoice
	if t.legOpenLocked() && t.on == decode && t.PrefillWorker == failed {
		q = r.retryPickLocked(t, in, cands)
	}
	if q == nil {
		r.mu.Unlock()
		t.PrefillDone(err)
		return false
	}
	t.releasePrefillLocked(in.Now)
	r.setPrefillLocked(t, &q.c, q.predicted)
	t.pf.retried = true
	r.mu.Unlock()
	r.withdrawPrefill(t)
	r.bookPrefillSpec(t, in.Keys)
	r.capacityFreed()
	return true
}

// legOpenLocked reports whether t's remote prefill leg is under way: booked, not
// ended by PrefillDone, a first token or the ticket's end. Caller holds r.mu.
func (t *Ticket) legOpenLocked() bool {
	return t.PrefillWorker != "" && !t.ended && !t.pf.done && !t.pf.failed && t.firstAt.IsZero()
}

// retryChoice is the prefill worker a retry picked and its prediction for the leg.
type retryChoice struct {
	c         scoring.Candidate
	predicted scoring.Prediction
}

// retryPickLocked is RetryPrefill's pair pick over cands (t's decode worker and the
// other prefill-capable workers, sorted by name), nil for a local prefill. t's own
// booking on its decode worker is left out while the pick reads it. Caller holds r.mu.
func (r *Router) retryPickLocked(t *Ticket, in *input, cands []scoring.Candidate) *retryChoice {
	dec := -1
	for i := range cands {
		if cands[i].Worker.Name == t.on {
			dec = i
		} else { // may only prefill: the decode worker stays t's
			w := *cands[i].Worker
			w.Role = workers.RolePrefill
			cands[i].Worker = &w
		}
	}
	if dec < 0 || len(cands) < 2 {
		return nil
	}
	f := r.flights[t.on]
	if f != nil {
		t.bookLocked(f, -1)
	}
	for i := range cands {
		r.bookedLocked(&cands[i], in.Now, in.BlockSize)
	}
	pd := r.decideLocked(in, cands, true)
	if f != nil {
		t.bookLocked(f, 1)
	}
	if pd.Shed || pd.Index != dec || pd.Prefill < 0 || pd.Prefill >= len(cands) || pd.Prefill == dec {
		return nil
	}
	return &retryChoice{c: cands[pd.Prefill], predicted: pd.PrefillPredicted}
}

// RemotePrefill reports whether the request is to be prefilled on PrefillAddress: it has
// a prefill worker and no PrefillDone error made it fall back to local prefill.
func (t *Ticket) RemotePrefill() bool {
	if t.PrefillWorker == "" {
		return false
	}
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	return !t.pf.failed
}

// bookPrefillLocked adds (sign 1) or removes (sign -1) the prefill leg's booking on f,
// the prefill worker's flight: one request prefilling t.pf.tokens. Caller holds r.mu.
func (t *Ticket) bookPrefillLocked(f *flight, sign int) {
	f.booked.Requests += sign
	f.booked.Prefilling += sign
	f.booked.PrefillTokens += sign * t.pf.tokens
	f.booked.KVTokens += sign * t.PromptTokens
	t.r.gaugesLocked(t.pf.on, f)
}

// releasePrefillLocked ends the prefill leg at time at, releasing its booking if still
// held. Caller holds r.mu.
func (t *Ticket) releasePrefillLocked(at time.Time) {
	t.pf.done = true
	if t.pf.on == "" {
		return
	}
	if f := t.r.flights[t.pf.on]; f != nil {
		t.bookPrefillLocked(f, -1)
		f.left.first.add(at) // it left the prefill worker's waiting queue
	}
	t.pf.on = ""
}

// prefillObservationLocked returns the prefill leg's observation ending at at, and
// whether it is to be learned: the leg is still open and a prefill worker ran it. At
// the first token without a PrefillDone (behind Envoy the decode worker's sidecar runs
// the leg unseen) the observed TTFT less the predicted transfer stands for the leg.
// Caller holds r.mu.
func (t *Ticket) prefillObservationLocked(at time.Time) (scoring.Observation, bool) {
	if t.PrefillWorker == "" || t.pf.done || t.pf.failed || t.pf.on == "" {
		return scoring.Observation{}, false
	}
	ttft := at.Sub(t.pf.start)
	if !t.firstAt.IsZero() {
		ttft -= t.Predicted.Transfer
	}
	if ttft <= 0 {
		return scoring.Observation{}, false
	}
	return scoring.Observation{Worker: t.PrefillWorker, PromptTokens: t.PromptTokens, CachedTokens: t.PrefillCachedTokens,
		Booked: t.pf.booked, Load: t.pf.load, Predicted: t.pf.predicted, Start: t.pf.start, TTFT: ttft}, true
}

// disaggregated reports whether any candidate has a prefill/decode role: the pick is
// then a pair pick (pickPairLocked).
func disaggregated(cands []scoring.Candidate) bool {
	for i := range cands {
		if cands[i].Worker.Role != workers.RoleAggregated {
			return true
		}
	}
	return false
}

// anyDecodes reports whether any candidate may decode (answer a request).
func anyDecodes(cands []scoring.Candidate) bool {
	for i := range cands {
		if cands[i].Worker.Role.Decodes() {
			return true
		}
	}
	return false
}

// decideLocked is the policy's decision for a pick, Explain and the wait's dry run
// alike: the pair pick (pickPairLocked) on a disaggregated pool, else the policy's Pick
// (Prefill −1). Either refuses by the same rule (the policy's admission: scoring's
// refusal, the router's calibrated threshold in Input.RefuseAbove). Caller holds r.mu.
func (r *Router) decideLocked(in *input, cands []scoring.Candidate, pair bool) scoring.PairDecision {
	if pair {
		return r.pickPairLocked(in, cands)
	}
	return scoring.PairDecision{Decision: r.opt.Policy.Pick(&in.Input, cands), Prefill: -1}
}

// pickPairLocked chooses the decode worker and, unless it prefills locally, the prefill
// worker: the policy's PickPair when it is a scoring.PairPicker, else the plain pair
// pick — the policy's Pick among the workers that prefill (prefill, both, aggregated;
// the decode workers too when there are no others); a prefill-only winner pairs with the
// decode or both worker holding the fewest booked requests (then fewest decoding, then
// name), any other winner serves the request alone. Decision.Index −1 (or Shed) is a
// refusal. Caller holds r.mu.
func (r *Router) pickPairLocked(in *input, cands []scoring.Candidate) scoring.PairDecision {
	if pp, ok := r.opt.Policy.(scoring.PairPicker); ok {
		return pp.PickPair(&in.Input, cands)
	}
	var pre, dec []int
	for i := range cands {
		if role := cands[i].Worker.Role; role != workers.RoleDecode {
			pre = append(pre, i)
		}
		if cands[i].Worker.Role.ReceivesKV() {
			dec = append(dec, i)
		}
	}
	if len(dec) == 0 {
		// no worker receives KV: only the prefill-capable workers that decode too serve
		pre = pre[:0]
		for i := range cands {
			if cands[i].Worker.Role.Decodes() {
				pre = append(pre, i)
			}
		}
	}
	if len(pre) == 0 {
		for i := range cands {
			pre = append(pre, i) // decode workers only: each prefills its own
		}
	}
	sub := make([]scoring.Candidate, len(pre))
	for j, i := range pre {
		sub[j] = cands[i]
	}
	d := r.opt.Policy.Pick(&in.Input, sub)
	if d.Shed || d.Index < 0 || d.Index >= len(sub) {
		return scoring.PairDecision{Decision: d, Prefill: -1}
	}
	p := pre[d.Index]
	out := scoring.PairDecision{Decision: scoring.Decision{Index: p, Reason: d.Reason}, Prefill: -1}
	if d.Predictions != nil {
		out.Predicted = d.Predictions[d.Index]
	}
	if cands[p].Worker.Role.Decodes() {
		return out // serves the request alone
	}
	best := dec[0]
	for _, i := range dec[1:] {
		a, b := cands[i].Booked, cands[best].Booked
		if a.Requests < b.Requests || a.Requests == b.Requests && a.Decoding < b.Decoding {
			best = i
		}
	}
	out.Index, out.Prefill, out.PrefillPredicted = best, p, out.Predicted
	return out
}

// setPrefillLocked makes c t's remote prefill worker and books the leg there: the
// uncached prompt on c (PromptTokens − c.CachedTokens), while t's own worker books the
// request with no prefill tokens (it receives the KV). Caller holds r.mu.
func (r *Router) setPrefillLocked(t *Ticket, c *scoring.Candidate, predicted scoring.Prediction) {
	t.PrefillWorker, t.PrefillAddress, t.PrefillCachedTokens = c.Worker.Name, c.Worker.Address, c.CachedTokens
	t.pf = prefillLeg{on: c.Worker.Name, tokens: max(t.PromptTokens-c.CachedTokens, 0), booked: c.Booked, load: c.Load,
		predicted: predicted, start: r.opt.Now()}
	t.prefill = 0
	t.bookPrefillLocked(r.flightLocked(c.Worker.Name), 1)
}

// prefillRemovedLocked drops the prefill legs booked on the removed worker name (their
// front will see the prefill fail and fall back). Caller holds r.mu.
func (r *Router) prefillRemovedLocked(name string) {
	for _, t := range r.tickets {
		if t.pf.on == name {
			t.pf.on = ""
		}
	}
}

// transferObservedLocked returns the observed transfer of t, whose first token came at
// at: from its prefill leg's end (PrefillDone(nil)) to now, and whether there is one
// (a remote prefill the front reported done, not fallen back). Caller holds r.mu.
func (t *Ticket) transferObservedLocked(at time.Time) (time.Duration, bool) {
	if t.PrefillWorker == "" || t.pf.failed || t.pf.endAt.IsZero() {
		return 0, false
	}
	return at.Sub(t.pf.endAt), true
}

// observeTransfer teaches a scoring.TransferLearner policy t's observed transfer d.
func (r *Router) observeTransfer(t *Ticket, d time.Duration) {
	if tl, ok := r.opt.Policy.(scoring.TransferLearner); ok {
		tl.ObserveTransfer(max(t.PromptTokens-t.CachedTokens, 0), t.kvBytesPerToken, d, t.Predicted.Transfer)
	}
}

// pdDecision names a pair pick for kvroute_router_pd_decisions_total.
func pdDecision(t *Ticket) string {
	if t.PrefillWorker != "" {
		return "remote"
	}
	return "local"
}
