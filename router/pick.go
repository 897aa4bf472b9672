package router

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tracing"
	"github.com/kvroute/kvroute/workers"
	"go.opentelemetry.io/otel/attribute"
)

// PickOptions are per-request inputs that do not come from the body.
type PickOptions struct {
	RequestID string        // for logs and the admin view; "" → generated
	SLO       time.Duration // TTFT objective from x-slo-ttft-ms; 0 none
	// RefuseOnSLOMiss refuses the request (429, x-kvroute-rejected-reason: slo_miss,
	// Retry-After = the best worker's predicted TTFT minus the SLO: the time its queue
	// needs to drain that far) when no worker is predicted to start it within SLO,
	// instead of sending it to the best of the workers that miss. Needs SLO > 0; a
	// pick without token information is refused when its load-only prediction (queue
	// and overhead, a lower bound of the TTFT) is past the SLO.
	RefuseOnSLOMiss bool
	// Exclude names a worker not to pick (a retry after that worker refused the
	// connection); "" none.
	Exclude string
	// Subset, when SubsetHint is set, restricts the pick to the workers whose "ip:port"
	// address is listed: the Gateway API Inference Extension endpoint subset hint
	// (docs/proposals/004-endpoint-picker-protocol, "Endpoint Subset"). An empty or
	// fully ineligible list is a 503.
	Subset     []string
	SubsetHint bool
	// Fallbacks is how many next-best workers Ticket.Fallbacks lists after the pick, in
	// order of preference (the protocol's "ip:port,ip:port,..." destination list for
	// gateways that retry down it); 0 none.
	Fallbacks int
	// Classify, when set, is called once per Pick with the prompt tokens the router
	// counted (0 unknown), before the decision; the ClassPolicy it returns replaces SLO,
	// RefuseOnSLOMiss and Wait. Admission's QoS classes use it: a class can match on
	// prompt length.
	Classify func(promptTokens int) ClassPolicy
	// Wait (with SLO > 0) makes Pick answer ErrWait, booking nothing, when the
	// worker the policy would pick is saturated (Options.Saturation): its engine would
	// not schedule the request at its next step, so sending it there only queues it
	// in the engine's FCFS queue, where kvroute's priority and fairness no longer
	// apply; it waits in kvroute's queue instead and is picked again when capacity
	// frees (late binding). A pick onto a worker below saturation goes ahead whatever
	// its predicted TTFT — waiting makes it no faster and leaves the step under-filled
	// — and the choice among workers stays the policy's (its cache affinity and load
	// balance: the queue changes when a request is sent, not where). The answer
	// depends on the request (its cached prefix decides the policy's choice), so
	// the queue tries entries behind one told to wait (FairQueue.Drain). The policy
	// decides as a dry run first (scoring.Input.DryRun) when any candidate is
	// saturated; only a pick that goes ahead changes its state.
	Wait bool
}

// ClassPolicy is what a request's class decides for its pick (PickOptions.Classify):
// its TTFT objective, whether it may wait in kvroute's queue, whether it is refused
// when no worker is predicted to meet the objective.
type ClassPolicy struct {
	SLO             time.Duration
	Wait            bool
	RefuseOnSLOMiss bool
	// Class names the class, whose requests' outcomes calibrate its own refusal margin
	// (slomargin.go); "" is the class of requests with no class.
	Class string
	// Priority: the refusal threshold of a class is tightened while a class of higher
	// priority meets its objective less often than its Attainment asks.
	Priority int
	// Attainment is the share of the class's requests that should meet SLO, in (0, 1);
	// 0 = DefaultSLOAttainment.
	Attainment float64
}

// Pick chooses a worker for req and books it. The returned Ticket must be ended with
// Done or Abort (FirstToken first, when observed); an unended ticket is released by the
// sweep after TicketTTL. Errors are *Error.
func (r *Router) Pick(ctx context.Context, req *request.Request, opt PickOptions) (*Ticket, error) {
	sc := getScratch()
	defer putScratch(sc)
	in, cands, err := r.prepare(ctx, req, opt, sc)
	if err != nil {
		return nil, err
	}
	_, span := tracing.Start(ctx, r.opt.Tracer, tracing.SpanPick)
	defer span.End()
	start := time.Now()
	r.prepolicy(in, cands)
	r.mu.Lock()
	// prepare ran without r.mu: a worker may have left the registry since. Its removal
	// listener needs r.mu, so a worker still registered now is cleaned up after this
	// booking, and one already gone must not be booked (it would re-create its flight,
	// gauges and speculative index entries after the cleanup).
	if r.opt.Registry.Version() != in.regVersion {
		cands = r.liveLocked(cands)
	}
	if len(cands) == 0 {
		r.mu.Unlock()
		return nil, r.noHealthy(req.Model)
	}
	for i := range cands {
		r.bookedLocked(&cands[i], in.Now, in.BlockSize)
	}
	pair := disaggregated(cands)
	if pair && !anyDecodes(cands) {
		r.mu.Unlock()
		return nil, r.noHealthy(req.Model) // prefill-only workers answer no request
	}
	if (opt.Wait || in.wait) && in.SLO > 0 && r.waitLocked(in, cands, pair) {
		r.mu.Unlock()
		return nil, ErrWait
	}
	pd := r.decideLocked(in, cands, pair)
	d := pd.Decision
	r.observeScaling(in, d)
	if d.Shed || d.Index < 0 || d.Index >= len(cands) {
		r.mu.Unlock()
		ra := d.RetryAfter
		if ra <= 0 {
			ra = time.Second
		}
		if d.Reason == scoring.ReasonSLO {
			r.sloMargin.refused(in.cls)
			r.m.Errors.WithLabelValues("slo_miss").Inc()
			return nil, sloMissError(d, in.SLO, ra)
		}
		r.m.Errors.WithLabelValues("shed").Inc()
		return nil, &Error{Status: StatusTooManyRequests, Type: "rate_limit_error", RetryAfter: ra,
			Message: "all workers are predicted to miss the TTFT limit; retry later"}
	}
	c := cands[d.Index]
	t := &Ticket{
		r: r, id: r.seq.Add(1), RequestID: opt.RequestID, Worker: c.Worker.Name, Address: c.Worker.Address,
		Model: in.Model, PromptTokens: in.PromptTokens, CachedTokens: c.CachedTokens, Reason: d.Reason,
		Path: in.path, Degraded: in.Degraded, Start: in.Now, booked: c.Booked, load: c.Load, kvBytesPerToken: in.KVBytesPerToken,
	}
	if d.Predictions != nil {
		t.Predicted = d.Predictions[d.Index]
	}
	if pair && pd.Predicted.TTFT > 0 {
		t.Predicted = pd.Predicted
	}
	if in.SLO > 0 { // its outcome calibrates its class's refusal margin and pressure
		t.slo = in.cls // in.cls.SLO is in.SLO
		if in.Degraded == "" {
			t.sloPred = t.Predicted.TTFT
		}
		r.sloMargin.admitted(t, req.Stream, in.Now)
	}
	if opt.Fallbacks > 0 {
		t.Fallbacks = fallbacks(cands, d, opt.Fallbacks)
	}
	t.prefill = max(in.PromptTokens-c.CachedTokens, 0)
	t.kvTokens = max(in.PromptTokens, 0) + max(in.MaxTokens, 0)
	if t.RequestID == "" {
		t.RequestID = fmt.Sprintf("kvr-%d", t.id)
	}
	t.on, t.onAddress = t.Worker, t.Address
	r.tickets[t.id] = t
	if pd.Prefill >= 0 && pd.Prefill < len(cands) && pd.Prefill != d.Index {
		r.setPrefillLocked(t, &cands[pd.Prefill], pd.PrefillPredicted)
	}
	t.bookLocked(r.flightLocked(t.Worker), 1)
	r.mu.Unlock()
	if pair {
		r.m.PDDecisions.WithLabelValues(pdDecision(t)).Inc()
	}
	r.book(t, in.Keys)
	r.m.DecisionSeconds.Observe(time.Since(start).Seconds())
	r.m.Decisions.WithLabelValues(t.Worker, d.Reason).Inc()
	if sh, ok := r.opt.Tokenizer.(tokenize.Shadower); ok && in.path == tokenize.PathLocal {
		sh.Shadow(req, in.path, in.Tokens, t.Address) // sampled; checked off the request path
	}
	if in.PromptTokens > 0 {
		r.m.PromptTokens.Observe(float64(in.PromptTokens))
		r.m.PromptTokensSeen.Add(float64(in.PromptTokens))
		r.m.CachedTokens.Observe(float64(t.CachedTokens))
		r.m.PrefixHitTokens.Add(float64(t.CachedTokens))
	}
	return t, nil
}

type input struct {
	scoring.Input
	path       tokenize.Path
	regVersion uint64      // the registry version the candidates were read at
	wait       bool        // PickOptions.Classify allowed waiting
	cls        ClassPolicy // its SLO is the objective in.SLO
	// sloMargin, sloPressure, sloCorrection: with RefuseAbove, the margin and the class's
	// own pressure and correction threshold read (the autoscaling gauges).
	sloMargin, sloPressure, sloCorrection float64
}

// prepare does the lock-free part of a pick: candidates, tokenization, block keys,
// index lookup, scraped load. What it returns lives in sc (nil: a new one), for the
// pick's duration.
func (r *Router) prepare(ctx context.Context, req *request.Request, opt PickOptions, sc *pickScratch) (*input, []scoring.Candidate, error) {
	if sc == nil {
		sc = new(pickScratch)
	}
	ws, known, version := r.opt.Registry.CandidatesAt(req.Model, sc.ws[:0])
	sc.ws = ws
	if !known {
		if req.Model == "" {
			r.m.Errors.WithLabelValues("no_worker").Inc()
			return nil, nil, &Error{Status: StatusServiceUnavailable, Type: "service_unavailable", Message: "no workers are configured"}
		}
		r.m.Errors.WithLabelValues("unknown_model").Inc()
		return nil, nil, &Error{Status: StatusNotFound, Type: "NotFoundError",
			Message: fmt.Sprintf("The model `%s` does not exist.", echoModel(req.Model))}
	}
	if opt.Exclude != "" {
		ws = slices.DeleteFunc(ws, func(w *workers.Worker) bool { return w.Name == opt.Exclude })
	}
	if opt.SubsetHint {
		ws = slices.DeleteFunc(ws, func(w *workers.Worker) bool { return !slices.Contains(opt.Subset, w.Address) })
		if len(ws) == 0 {
			r.m.Errors.WithLabelValues("subset").Inc()
			return nil, nil, &Error{Status: StatusServiceUnavailable, Type: "service_unavailable",
				Message: fmt.Sprintf("no healthy worker for model %q among the gateway's endpoint subset", echoModel(req.Model))}
		}
	}
	if len(ws) == 0 {
		return nil, nil, r.noHealthy(req.Model)
	}
	md, ok := r.models[req.Model]
	if !ok {
		md = Model{Name: req.Model, BlockSize: r.opt.DefaultBlockSize}
	}
	in := &sc.in
	*in = input{regVersion: version, Input: scoring.Input{RequestID: opt.RequestID, Request: req, Model: req.Model,
		BlockSize: md.BlockSize, MaxTokens: req.MaxTokens, SLO: opt.SLO, Now: r.opt.Now(), KVBytesPerToken: md.KVBytesPerToken, Scratch: &sc.policy}}
	if md.Base != "" {
		in.Adapter = md.Name // a LoRA adapter of md.Base: vLLM's lora_name is the served adapter name
	}
	if req.API == request.APIOther {
		in.Degraded, in.path = "not_inference", tokenize.PathNone
	} else {
		tctx, span := tracing.Start(ctx, r.opt.Tracer, tracing.SpanTokenize)
		res, err := r.opt.Tokenizer.Tokenize(tctx, req)
		span.SetAttributes(tracing.TokenizePath.String(string(res.Path)), attribute.Int("gen_ai.usage.input_tokens", res.PromptTokens))
		span.End()
		switch {
		case err != nil:
			in.Degraded, in.path = "tokenize_failed", tokenize.PathNone
		case res.Path == tokenize.PathNone:
			in.Degraded, in.path = res.Degraded, tokenize.PathNone
			if in.Degraded == "" {
				in.Degraded = "no_tokens"
			}
		default:
			in.path, in.Tokens, in.PromptTokens = res.Path, res.Tokens, res.PromptTokens
		}
	}
	in.RefuseOnSLOMiss = opt.RefuseOnSLOMiss
	in.cls = ClassPolicy{SLO: in.SLO, RefuseOnSLOMiss: in.RefuseOnSLOMiss}
	if opt.Classify != nil {
		in.cls = opt.Classify(in.PromptTokens)
		in.SLO, in.wait, in.RefuseOnSLOMiss = in.cls.SLO, in.cls.Wait, in.cls.RefuseOnSLOMiss
	}
	if in.RefuseOnSLOMiss && in.SLO > 0 {
		in.RefuseAbove, in.sloMargin, in.sloPressure, in.sloCorrection = r.sloMargin.threshold(in.cls, in.Now)
	}
	if limit := r.maxPromptTokens(md); len(in.Tokens) > limit {
		// Routing considers the first limit tokens: what is hashed, looked up and booked
		// is bounded per request; the prediction still sees the whole prompt length.
		in.Tokens = in.Tokens[:limit]
		r.m.PromptsCapped.Inc()
	}
	if len(in.Tokens) > 0 {
		ns := kvindex.Namespace{Model: req.Model, CacheSalt: req.CacheSalt}
		if md.Base != "" {
			ns.Model, ns.LoRA = md.Base, md.Name
		}
		in.Keys = kvindex.HashBlocks(ns.Seed(), in.Tokens, md.BlockSize, sc.keys[:0])
		sc.keys = in.Keys
	}
	sc.cands = grown(sc.cands, len(ws))
	cands := sc.cands
	loads := r.opt.Registry.Loads(ws, sc.loads[:0])
	sc.loads = loads
	for i, w := range ws {
		cands[i] = scoring.Candidate{Worker: w, Load: loads[i]}
	}
	if r.opt.Index != nil && len(in.Keys) > 0 {
		_, span := tracing.Start(ctx, r.opt.Tracer, tracing.SpanIndexLookup)
		defer span.End()
		span.SetAttributes(attribute.Int("kvroute.blocks", len(in.Keys)))
		sc.matches = r.opt.Index.Lookup(in.Keys, sc.matches[:0])
		for _, m := range sc.matches {
			// ws is sorted by name (Registry.Candidates): a binary search per match, no map.
			if i, ok := slices.BinarySearchFunc(ws, m.Worker, func(w *workers.Worker, name string) int {
				return strings.Compare(w.Name, name)
			}); ok {
				cands[i].Cached = m
				// vLLM's hit is block-aligned and never the whole prompt: at most
				// ⌊(prompt−1)/block_size⌋ blocks (vllm/v1/core/kv_cache_manager.py
				// get_computed_blocks recomputes the last token).
				cands[i].CachedTokens = min(m.Blocks, max(in.PromptTokens-1, 0)/md.BlockSize) * md.BlockSize
			}
		}
	}
	return in, cands, nil
}

// noHealthy counts and returns the 503 for a model with no healthy worker.
func (r *Router) noHealthy(model string) *Error {
	r.m.Errors.WithLabelValues("no_worker").Inc()
	return &Error{Status: StatusServiceUnavailable, Type: "service_unavailable",
		Message: fmt.Sprintf("no healthy worker serves model %q", model)}
}

// liveLocked drops, in place, the candidates whose worker is no longer the one
// registered under its name (removed, or replaced with a changed one). Caller holds r.mu.
func (r *Router) liveLocked(cands []scoring.Candidate) []scoring.Candidate {
	out := cands[:0]
	for _, c := range cands {
		if w, ok := r.opt.Registry.Get(c.Worker.Name); ok && w == c.Worker {
			out = append(out, c)
		}
	}
	return out
}

// maxPromptTokens is the number of prompt tokens routing considers for model md.
func (r *Router) maxPromptTokens(md Model) int {
	if md.MaxModelLen > 0 {
		return md.MaxModelLen
	}
	return r.opt.MaxPromptTokens
}

// prepolicy gives each candidate its bookings as last published and lets a Preparer
// policy do its per-candidate work, both without r.mu; Pick and Explain then redo,
// under r.mu, only what the bookings made since invalidate.
func (r *Router) prepolicy(in *input, cands []scoring.Candidate) {
	sp, ok := r.opt.Policy.(scoring.Preparer)
	if !ok {
		return
	}
	peers, hl := r.peerBooked.Load(), r.writeHalfLife()
	for i := range cands {
		var b scoring.Booked
		if v, ok := r.pub.Load(cands[i].Worker.Name); ok {
			b = v.(*flight).snapshot()
		}
		cands[i].Booked = b
		addPeer(&cands[i], peers, in.Now, hl, in.BlockSize)
	}
	sp.Prepare(&in.Input, cands)
}

// fallbacks lists up to n candidates other than the chosen one, best first: by
// predicted TTFT when the policy predicts, else by fewest booked requests (name order
// breaks ties, as the candidates are sorted by name).
func fallbacks(cands []scoring.Candidate, d scoring.Decision, n int) []string {
	order := make([]int, 0, len(cands))
	for i := range cands {
		if i != d.Index && cands[i].Worker.Role.Decodes() { // a prefill-only worker answers no request
			order = append(order, i)
		}
	}
	sort.SliceStable(order, func(a, b int) bool {
		i, j := order[a], order[b]
		if d.Predictions != nil && d.Predictions[i].TTFT != d.Predictions[j].TTFT {
			return d.Predictions[i].TTFT < d.Predictions[j].TTFT
		}
		return cands[i].Booked.Requests < cands[j].Booked.Requests
	})
	out := make([]string, 0, min(n, len(order)))
	for _, i := range order[:min(n, len(order))] {
		out = append(out, cands[i].Worker.Address)
	}
	return out
}
