package router

import (
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tracing"
	"github.com/kvroute/kvroute/workers"
	"go.opentelemetry.io/otel/attribute"
)

// Ticket is one booked routing decision. Its exported fields are set at Pick and never
// change; FirstToken, Done and Abort are safe to call from any goroutine, in any order,
// any number of times: only the first Done/Abort counts, and FirstToken after either
// is ignored.
type Ticket struct {
	r  *Router
	id uint64

	RequestID    string
	Worker       string // worker name
	Address      string // "ip:port" to send the request to
	Model        string
	PromptTokens int // 0 when unknown
	CachedTokens int // predicted cached prefix on Worker, tokens
	Reason       string
	Path         tokenize.Path
	Degraded     string
	Predicted    scoring.Prediction
	Start        time.Time
	// Fallbacks are the addresses of the next-best workers after Address, best first
	// (PickOptions.Fallbacks of them at most); nil unless asked for.
	Fallbacks []string
	// PrefillWorker and PrefillAddress ("ip:port") name the worker that prefills the
	// prompt for Worker in prefill/decode disaggregation (docs/pd.md): the fronts send
	// the request there first with kv_transfer_params {"do_remote_decode": true} and
	// max_tokens 1, then to Address with the kv_transfer_params it returned (llm-d's
	// x-prefiller-host-port convention). Both empty: Worker prefills locally (an
	// aggregated worker, or the decode worker's own choice). They describe the pick and
	// change only when the front that owns the ticket retries a failed leg
	// (RetryPrefill); after a failed prefill that is not retried (PrefillDone with an
	// error) RemotePrefill reports false and the request is sent to Address alone.
	PrefillWorker  string
	PrefillAddress string
	// PrefillCachedTokens is the predicted cached prefix on PrefillWorker, tokens (0
	// when it is empty).
	PrefillCachedTokens int

	prefill int // booked uncached prefill tokens
	// kvBytesPerToken is the model's KV bytes per token at the pick (0: the policy's
	// default), for the transfer a remote prefill moves
	kvBytesPerToken float64
	kvTokens        int            // KV footprint booked: prompt + requested output tokens
	slo             ClassPolicy    // the class of a request picked with an objective (SLO > 0); zero none
	sloPred         time.Duration  // with slo: the predicted TTFT it was admitted on; 0 none
	booked          scoring.Booked // the worker's bookings before this one (learning feature)
	load            workers.Load

	// guarded by r.mu
	firstAt time.Time
	ended   bool
	outcome response.Outcome // set when ended (outcome.go)
	// on is the worker holding the booking: Worker, unless Served moved it (onAddress
	// its address; moved: the prediction was made for another worker).
	on, onAddress string
	moved         bool

	pf prefillLeg // the booking on PrefillWorker (guarded by r.mu; pd.go)

	released atomic.Bool                     // ended (set under r.mu), read without it
	spec     atomic.Pointer[kvindex.Booking] // speculative entries booked for it; nil none
	pfSpec   atomic.Pointer[kvindex.Booking] // speculative entries booked on PrefillWorker; nil none
	onFirst  atomic.Pointer[func(ttft time.Duration)]
	// sloCounted: its outcome has been folded into its class's refusal margin.
	sloCounted atomic.Bool
}

// OnFirstToken makes FirstToken call f with the observed TTFT (from Start to the first
// token), once, outside the router's lock, after its own metrics; a later call replaces
// f. The admission stage uses it for its per-tenant TTFT. Safe for concurrent use.
func (t *Ticket) OnFirstToken(f func(ttft time.Duration)) { t.onFirst.Store(&f) }

// FirstToken records that the first generated token reached kvroute at time at (zero
// → now): the prefill part of the booking is released and the observed TTFT is handed
// to the policy if it learns.
func (t *Ticket) FirstToken(at time.Time) {
	r := t.r
	if at.IsZero() {
		at = r.opt.Now()
	}
	r.mu.Lock()
	if t.ended || !t.firstAt.IsZero() {
		r.mu.Unlock()
		return
	}
	on := t.on
	f := r.flights[on]
	if f != nil {
		t.bookLocked(f, -1) // as prefilling
	}
	t.firstAt = at
	if f != nil {
		t.bookLocked(f, 1) // as decoding
		f.left.first.add(at)
	}
	// A first token means the prefill leg is over, whether or not the front reported it
	// (behind Envoy the decode worker's sidecar runs it, unseen).
	pfObs, pfLearn := t.prefillObservationLocked(at)
	xfer, xferSeen := t.transferObservedLocked(at)
	t.releasePrefillLocked(at)
	learns := t.learnsLocked()
	r.mu.Unlock()
	ttft := at.Sub(t.Start)
	if t.slo.SLO > 0 {
		r.sloMargin.observe(t, ttft)
	}
	r.m.TicketsReleased.WithLabelValues("first_token").Inc()
	r.m.TTFTSeconds.WithLabelValues(on).Observe(ttft.Seconds())
	if l, ok := r.opt.Policy.(scoring.Learner); ok {
		switch {
		case learns:
			l.Observe(t.observation(ttft, 0, response.Usage{}, 0))
		case pfLearn:
			l.Observe(pfObs)
		}
	}
	if xferSeen {
		r.observeTransfer(t, xfer)
	}
	if f := t.onFirst.Load(); f != nil {
		(*f)(ttft)
	}
	r.capacityFreed()
}

// Done records completion (end of stream, trailers, or a complete non-streamed body)
// at time at (zero → now) with the upstream status and the usage the engine reported,
// classified on the status alone (response.StatusOutcome). Fronts that track the body
// call Complete with the body's outcome instead.
func (t *Ticket) Done(status int, usage response.Usage, at time.Time) {
	t.Complete(response.Result{Status: status, Usage: usage, Outcome: response.StatusOutcome(status)}, at)
}

// Abort releases the booking without learning (client went away, upstream reset,
// stream cancelled): outcome aborted.
func (t *Ticket) Abort() {
	t.AbortWith(response.OutcomeAborted)
}

func (t *Ticket) firstAtLocked() time.Time {
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	return t.firstAt
}

// end ends t with outcome o and reports true, or reports false and the outcome t
// already ended with.
func (r *Router) end(t *Ticket, how string, o response.Outcome) (response.Outcome, bool) {
	r.mu.Lock()
	if t.ended {
		o = t.outcome
		r.mu.Unlock()
		return o, false
	}
	r.releaseLocked(t, o)
	r.mu.Unlock()
	r.m.TicketsReleased.WithLabelValues(how).Inc()
	r.capacityFreed()
	return o, true
}

// releaseLocked removes t's booking, recording outcome o. Caller holds r.mu and counts
// the release.
func (r *Router) releaseLocked(t *Ticket, o response.Outcome) {
	if t.ended {
		return
	}
	t.ended, t.outcome = true, o
	t.released.Store(true)
	delete(r.tickets, t.id)
	if f := r.flights[t.on]; f != nil {
		t.bookLocked(f, -1)
		// It has left the engine: the waiting queue if it ended before its first
		// token, the running set after.
		if now := r.opt.Now(); t.firstAt.IsZero() {
			f.left.first.add(now)
		} else {
			f.left.finished.add(now)
		}
	}
	t.releasePrefillLocked(r.opt.Now())
}

func (t *Ticket) observation(ttft, e2e time.Duration, u response.Usage, status int) scoring.Observation {
	return scoring.Observation{Worker: t.Worker, PromptTokens: t.PromptTokens, CachedTokens: t.CachedTokens,
		Booked: t.booked, Load: t.load, Predicted: t.Predicted, Start: t.Start, TTFT: ttft, E2E: e2e, Usage: u, Status: status}
}

// TraceAttributes describes the decision for the request's kvroute.route span (package
// tracing): the GenAI model and prompt size, the worker, its predicted cached tokens
// and TTFT (seconds), the reason and any degradation.
func (t *Ticket) TraceAttributes() []attribute.KeyValue {
	a := []attribute.KeyValue{tracing.Model(t.Model), tracing.Worker.String(t.Worker), tracing.Reason.String(t.Reason),
		tracing.CachedTokens.Int(t.CachedTokens), tracing.TokenizePath.String(string(t.Path))}
	if t.PromptTokens > 0 {
		a = append(a, tracing.Usage(t.PromptTokens, -1)...)
	}
	if t.Predicted.TTFT > 0 {
		a = append(a, tracing.PredictedTTFT.Float64(t.Predicted.TTFT.Seconds()))
	}
	if t.Degraded != "" {
		a = append(a, tracing.Degraded.String(t.Degraded))
	}
	return a
}

// servedLocked reads, under r.mu, the first-token time, the worker holding the
// booking and whether the ticket teaches the policy at completion (learnsLocked).
func (t *Ticket) servedLocked() (time.Time, string, bool) {
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	return t.firstAt, t.on, t.learnsLocked()
}

// learnsLocked reports whether the ticket's own TTFT and completion teach the policy:
// not when Served moved it (its prediction was for another worker), nor when its
// prefill was remote (its prefill leg teaches the prefill worker instead, pd.go) or
// fell back to local (its prediction was for the pair). Caller holds r.mu.
func (t *Ticket) learnsLocked() bool { return !t.moved && t.PrefillWorker == "" }

// Served records the endpoint ("ip:port") the gateway reports as having served the
// request: the GIE protocol's x-gateway-destination-endpoint-served response metadata
// (docs/proposals/004-endpoint-picker-protocol, "Destination Endpoint Served"). When it
// differs from the pick — the gateway retried down the fallback list — the booking
// (prefill tokens, or the decoding slot after the first token) moves to the worker at
// that address, and the ticket no longer teaches the policy: its prediction was made
// for another worker. Speculative index entries stay where they were booked (they
// expire with their TTL). It returns true when the booking moved; an address no
// registered worker has, the address already booked, or an ended ticket change nothing.
func (t *Ticket) Served(address string) bool {
	r := t.r
	var to *workers.Worker
	for _, w := range r.opt.Registry.All() {
		if w.Address == address {
			to = w
			break
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.ended || address == "" || address == t.onAddress {
		return false
	}
	if to == nil {
		r.m.ServedUnknown.Inc()
		return false
	}
	if f := r.flights[t.on]; f != nil {
		t.bookLocked(f, -1)
	}
	t.on, t.onAddress, t.moved = to.Name, to.Address, true
	t.bookLocked(r.flightLocked(to.Name), 1)
	r.m.ServedMoves.WithLabelValues(to.Name).Inc()
	return true
}
