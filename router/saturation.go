package router

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// Saturation says when a worker's engine can take no more work at its next step, in
// the engine's own terms (vLLM v1's scheduler, vllm/v1/core/sched/scheduler.py: each
// step schedules the running requests' decode tokens first, then admits waiting
// requests while len(running) < max_num_seqs and the step's token budget
// max_num_batched_tokens lasts, chunking prefills into what is left). A worker is
// saturated when kvroute's bookings on it (its own and its peers') fill either limit:
//
//	Booked.PrefillTokens + Booked.Decoding ≥ BatchTokens   (one token per decoding sequence)
//	Booked.Requests ≥ max_num_seqs   (the worker's Profile.MaxNumSeqs, else MaxNumSeqs)
//
// Below both, a request sent now is scheduled at the worker's next step, so holding it
// in kvroute's queue would leave capacity idle; at either, it would wait in the
// engine's FCFS queue, so it waits in kvroute's instead (PickOptions.Wait). Token-less bookings (Booked.Unsized)
// count against MaxNumSeqs only; scraped load is not used (it is as old as the scrape,
// and a scrape wakes no queue).
type Saturation struct {
	BatchTokens int // vLLM --max-num-batched-tokens; 0 → scoring.DefaultBatchTokens
	// MaxNumSeqs is vLLM's --max-num-seqs of a worker whose workers.Profile.MaxNumSeqs
	// is 0; 0 → DefaultMaxNumSeqs.
	MaxNumSeqs int
}

// DefaultMaxNumSeqs is vLLM's default --max-num-seqs for the OpenAI server on GPUs
// under 70 GiB and on A100s: 256 (vllm/engine/arg_utils.py,
// EngineArgs.get_batch_defaults; 1024 on larger GPUs — configure
// workers[].profile.max_num_seqs there).
const DefaultMaxNumSeqs = 256

// Saturated reports whether b fills s (the type's doc) on a worker without a
// max_num_seqs of its own.
func (s Saturation) Saturated(b scoring.Booked) bool { return s.SaturatedOn(nil, b) }

// SaturatedOn reports whether b fills s on w: w.Profile.MaxNumSeqs when set (w may be
// nil), else s.MaxNumSeqs, else DefaultMaxNumSeqs.
func (s Saturation) SaturatedOn(w *workers.Worker, b scoring.Booked) bool {
	bt, ns := s.BatchTokens, s.MaxNumSeqs
	if bt <= 0 {
		bt = scoring.DefaultBatchTokens
	}
	if w != nil && w.Profile.MaxNumSeqs > 0 {
		ns = w.Profile.MaxNumSeqs
	}
	if ns <= 0 {
		ns = DefaultMaxNumSeqs
	}
	return b.PrefillTokens+b.Decoding >= bt || b.Requests >= ns
}

// ErrWait is Pick's answer under PickOptions.Wait when the request should wait in
// kvroute's queue: the worker the policy would pick is saturated
// (Options.Saturation). Nothing was booked.
var ErrWait = errors.New("router: the worker the request would be sent to is saturated")

// waitLocked reports whether the request should wait (PickOptions.Wait): a worker
// of the pick the router would make (decideLocked as a dry run, scoring.Input.DryRun)
// is saturated — the worker picked, and on a disaggregated pool the pair's prefill
// worker too (its queue runs the prefill; the decode worker schedules the request once
// its KV arrives). No candidate saturated: no dry run. Caller holds r.mu.
func (r *Router) waitLocked(in *input, cands []scoring.Candidate, pair bool) bool {
	if !slices.ContainsFunc(cands, func(c scoring.Candidate) bool { return r.opt.Saturation.SaturatedOn(c.Worker, c.Booked) }) {
		return false
	}
	in.DryRun = true
	pd := r.decideLocked(in, cands, pair)
	in.DryRun = false
	d := pd.Decision
	if d.Shed || d.Index < 0 || d.Index >= len(cands) {
		return false // the pick refuses it: let Pick answer so
	}
	if q := pd.Prefill; q >= 0 && q < len(cands) && r.opt.Saturation.SaturatedOn(cands[q].Worker, cands[q].Booked) {
		return true
	}
	return r.opt.Saturation.SaturatedOn(cands[d.Index].Worker, cands[d.Index].Booked)
}

// RejectedReasonHeader names why kvroute refused a request itself (the admission
// stage's reasons, and ReasonSLOMiss).
const RejectedReasonHeader = "x-kvroute-rejected-reason"

// ReasonSLOMiss is the x-kvroute-rejected-reason of a request refused because no
// worker was predicted to start it within its TTFT objective (PickOptions.RefuseOnSLOMiss).
const ReasonSLOMiss = "slo_miss"

// AsSLOMiss returns err as the *Error of a request refused for its predicted TTFT
// (PickOptions.RefuseOnSLOMiss), or false for any other error.
func AsSLOMiss(err error) (*Error, bool) {
	re, ok := err.(*Error)
	return re, ok && re.Details == "kvroute_"+ReasonSLOMiss
}

// sloMissError is the 429 for a request no worker is predicted to start within slo:
// Retry-After ra (the best predicted TTFT's excess over slo, at least 1 s, capped by
// scoring.retry_after_max), the best prediction in the message.
func sloMissError(d scoring.Decision, slo, ra time.Duration) *Error {
	best := time.Duration(-1)
	for _, p := range d.Predictions {
		if best < 0 || p.TTFT < best {
			best = p.TTFT
		}
	}
	return &Error{Status: StatusTooManyRequests, Type: "rate_limit_error", RetryAfter: ra, Details: "kvroute_" + ReasonSLOMiss,
		Message: fmt.Sprintf("no worker is predicted to start this request within its TTFT objective of %.3gs (best predicted %.3gs); retry later",
			slo.Seconds(), max(best, 0).Seconds()),
		Header: [][2]string{{RejectedReasonHeader, ReasonSLOMiss}}}
}
