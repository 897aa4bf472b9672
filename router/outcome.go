package router

import (
	"time"

	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/scoring"
)

// Complete ends the ticket with the result of its response (status, usage, outcome;
// see response.Outcome) at time at (zero → now), and returns the outcome the ticket
// ended with: res.Outcome, or, when the ticket had already ended (released by the
// sweep, aborted, its worker removed), that earlier outcome. Fronts count the returned
// value, so each request is counted once with the outcome the router recorded.
//
// What is learned depends on the outcome:
//   - TTFT was handed over at FirstToken, for every request that produced a first
//     token, whatever its outcome;
//   - the E2E latency (kvroute_router_request_duration_seconds and the learner's
//     completion report, which carries usage for the cached-tokens drift) and the
//     usage report kind (kvroute_router_usage_reports_total) only for OutcomeOK: a
//     4xx, 5xx, error event or truncated stream says nothing about how long a good
//     completion takes.
func (t *Ticket) Complete(res response.Result, at time.Time) response.Outcome {
	r := t.r
	if at.IsZero() {
		at = r.opt.Now()
	}
	if res.Outcome == "" {
		res.Outcome = response.StatusOutcome(res.Status)
	}
	o, ok := r.end(t, "done", res.Outcome)
	if ok && res.Status >= 400 { // the worker refused the request: it computed none of its blocks
		r.withdraw(t)
	}
	if !ok || o != response.OutcomeOK {
		return o
	}
	e2e := at.Sub(t.Start)
	if t.slo.SLO > 0 && e2e <= t.slo.SLO { // met, whenever its first token came (TTFT ≤ E2E)
		r.sloMargin.met(t, e2e)
	}
	fa, on, learns := t.servedLocked()
	r.m.E2ESeconds.WithLabelValues(on).Observe(e2e.Seconds())
	r.m.UsageReports.WithLabelValues(res.Usage.CachedReport()).Inc()
	if l, ok := r.opt.Policy.(scoring.Learner); ok && learns {
		var ttft time.Duration
		if !fa.IsZero() {
			ttft = fa.Sub(t.Start)
		}
		l.Observe(t.observation(ttft, e2e, res.Usage, res.Status))
	}
	return o
}

// AbortWith releases the booking without learning, recording outcome o (aborted, or
// upstream_error when the worker could not be reached or read), and returns the
// outcome the ticket ended with (an earlier one when it had already ended).
//
// Before a first token its speculative index entries are withdrawn too: the worker may
// never have computed those blocks (after one, its KV events or the TTL settle them).
func (t *Ticket) AbortWith(o response.Outcome) response.Outcome {
	o, ok := t.r.end(t, "abort", o)
	if ok && t.firstAtLocked().IsZero() {
		t.r.withdraw(t)
	}
	return o
}

// Outcome returns the outcome the ticket ended with; "" while it is open.
func (t *Ticket) Outcome() response.Outcome {
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	return t.outcome
}
