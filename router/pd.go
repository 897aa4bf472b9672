package router

import (
	"time"

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
	done      bool               // PrefillDone was called (or the first token came): the leg is over
	failed    bool               // the leg failed: the decode worker prefills locally
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
	ttft := at.Sub(t.Start)
	if !t.firstAt.IsZero() {
		ttft -= t.Predicted.Transfer
	}
	if ttft <= 0 {
		return scoring.Observation{}, false
	}
	return scoring.Observation{Worker: t.PrefillWorker, PromptTokens: t.PromptTokens, CachedTokens: t.PrefillCachedTokens,
		Booked: t.pf.booked, Load: t.pf.load, Predicted: t.pf.predicted, Start: t.Start, TTFT: ttft}, true
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
	t.pf = prefillLeg{on: c.Worker.Name, tokens: max(t.PromptTokens-c.CachedTokens, 0), booked: c.Booked, load: c.Load, predicted: predicted}
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

// pdDecision names a pair pick for kvroute_router_pd_decisions_total.
func pdDecision(t *Ticket) string {
	if t.PrefillWorker != "" {
		return "remote"
	}
	return "local"
}
