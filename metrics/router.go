package metrics

import "github.com/prometheus/client_golang/prometheus"

// Router holds the router core's metrics.
type Router struct {
	Decisions        *prometheus.CounterVec   // worker, reason
	DecisionSeconds  prometheus.Histogram     // time to make one pick, tokenization excluded
	Errors           *prometheus.CounterVec   // reason: unknown_model, no_worker, shed
	InFlight         *prometheus.GaugeVec     // worker: booked requests
	InFlightTokens   *prometheus.GaugeVec     // worker: booked uncached prefill tokens
	TicketsReleased  *prometheus.CounterVec   // how: first_token (prefill part), done, abort, expired, worker_removed
	TTFTSeconds      *prometheus.HistogramVec // worker: observed time to first token
	E2ESeconds       *prometheus.HistogramVec // worker: observed end-to-end latency (outcome ok only)
	PromptTokens     prometheus.Histogram     // prompt length of routed requests, tokens
	CachedTokens     prometheus.Histogram     // predicted cached prefix of the chosen worker, tokens
	PrefixHitTokens  prometheus.Counter       // sum of predicted cached tokens on chosen workers
	PromptTokensSeen prometheus.Counter       // sum of prompt tokens of routed requests (hit ratio denominator)
	UsageReports     *prometheus.CounterVec   // kind: reported, absent, no_usage — how usage of ok requests reported cached tokens
	PromptsCapped    prometheus.Counter       // requests whose prompt was longer than the tokens routing considers
	SpecWithdrawn    prometheus.Counter       // speculative index entries withdrawn from failed or aborted requests
	ServedMoves      *prometheus.CounterVec   // worker (the one that served): bookings moved to the endpoint the gateway reports served
	ServedUnknown    prometheus.Counter       // served endpoints reported that no registered worker has
	PDDecisions      *prometheus.CounterVec   // decision (remote, local): prefill/decode picks on a disaggregated pool
	PDFallbacks      prometheus.Counter       // remote prefills that failed and fell back to local prefill on the decode worker
	BestTTFT         *prometheus.GaugeVec     // model: the best predicted TTFT of the latest pick (scaling signal)
	SLOMargin        prometheus.Gauge         // the SLO refusal rule's margin (p90 of observed ÷ predicted TTFT)
	SLOPressure      *prometheus.GaugeVec     // class: pressure a class puts on lower-priority classes
	SLOCorrection    *prometheus.GaugeVec     // class: correction of a class's own refusal threshold from its admitted misses
}

func newRouter(reg prometheus.Registerer) *Router {
	const sub = "router"
	r := &Router{
		PromptsCapped: must(reg, prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "prompts_capped_total", Help: "Requests whose prompt exceeded the tokens routing considers (models[].max_model_len or router.max_prompt_tokens); only that many leading tokens were hashed, looked up and booked."})),
		SpecWithdrawn: must(reg, prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "speculative_withdrawn_total", Help: "Speculative index entries withdrawn because their request failed (status >= 400) or was aborted before its first token."})),
		Decisions: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "decisions_total", Help: "Routing decisions by chosen worker and reason."}, []string{"worker", "reason"})),
		DecisionSeconds: must(reg, prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: sub,
			Name: "decision_duration_seconds", Help: "Time to make one pick (index lookup, scoring, booking), tokenization excluded.", Buckets: FastBuckets})),
		Errors: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "errors_total", Help: "Requests the router refused, by reason (unknown_model, no_worker, subset, shed, slo_miss: no worker predicted within the class objective under on_slo_miss: refuse)."}, []string{"reason"})),
		InFlight: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "in_flight_requests", Help: "Requests routed by kvroute and not yet finished, per worker."}, []string{"worker"})),
		InFlightTokens: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "in_flight_prefill_tokens", Help: "Uncached prompt tokens booked on a worker and not yet prefilled (no first token yet)."}, []string{"worker"})),
		TicketsReleased: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "tickets_released_total", Help: "In-flight releases by how they happened (first_token, done, abort, expired, worker_removed)."}, []string{"how"})),
		TTFTSeconds: must(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: sub,
			Name: "time_to_first_token_seconds", Help: "Observed time to first token of routed streaming requests, per worker (OpenTelemetry gen_ai.server.time_to_first_token).", Buckets: LatencyBuckets}, []string{"worker"})),
		E2ESeconds: must(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: sub,
			Name: "request_duration_seconds", Help: "Observed end-to-end latency of routed requests with outcome ok, per worker (OpenTelemetry gen_ai.server.request.duration).", Buckets: LatencyBuckets}, []string{"worker"})),
		PromptTokens: must(reg, prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: sub,
			Name: "prompt_tokens", Help: "Prompt length of routed requests in tokens.", Buckets: prometheus.ExponentialBuckets(16, 2, 14)})),
		CachedTokens: must(reg, prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: sub,
			Name: "predicted_cached_tokens", Help: "Cached prefix the index predicted on the chosen worker, tokens.", Buckets: prometheus.ExponentialBuckets(16, 2, 14)})),
		PrefixHitTokens: must(reg, prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "prefix_hit_tokens_total", Help: "Sum of predicted cached prompt tokens on chosen workers; divide by prompt_tokens_total for the prefix hit ratio."})),
		PromptTokensSeen: must(reg, prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "prompt_tokens_total", Help: "Sum of prompt tokens of routed requests with known token counts."})),
		UsageReports: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "usage_reports_total", Help: "Requests finished with outcome ok, by how their usage reported cached tokens (reported: a number, 0 included; absent: no count or null; no_usage: no usage object)."}, []string{"kind"})),
		ServedMoves: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "served_moves_total", Help: "Bookings moved because the gateway reported another endpoint served the request (a retry down the fallback list), by the worker that served."}, []string{"worker"})),
		ServedUnknown: must(reg, prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "served_unknown_total", Help: "Served-endpoint reports naming an address no registered worker has (the booking stays where it was)."})),
		PDDecisions: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "pd_decisions_total", Help: "Picks on a pool with prefill/decode roles, by decision (remote: prefill on a prefill worker, KV transferred to the decode worker; local: the decode worker prefills itself)."}, []string{"decision"})),
		PDFallbacks: must(reg, prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "pd_prefill_fallbacks_total", Help: "Remote prefills that failed (Ticket.PrefillDone with an error) and fell back to local prefill on the decode worker."})),
		BestTTFT: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "best_predicted_ttft_seconds", Help: "The lowest predicted TTFT over the workers at the latest pick of a request with tokens for the model, refused picks included, seconds: how long a new request would wait for its first token on the best worker now (the fleet's drain time; an autoscaling signal, docs/autoscaling.md)."}, []string{"model"})),
		SLOMargin: must(reg, prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "slo_margin", Help: "The SLO refusal rule's margin: the learned 90th percentile of observed ÷ predicted TTFT (a request is refused when margin × its best prediction is past its objective); 1 before any feedback."})),
		SLOPressure: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "slo_pressure", Help: "Pressure a class refusing on SLO miss puts on classes of lower priority (their refusal threshold is divided by it): above 1 while the class meets its objective less often than its slo_attainment; by class (configured classes)."}, []string{"class"})),
		SLOCorrection: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "slo_correction", Help: "Correction of a refusing class's own threshold (divided by it, with the margin): above 1 while more of its admitted requests miss their objective than its slo_attainment allows, 1 once they meet it; by class (configured classes)."}, []string{"class"})),
	}
	r.SLOMargin.Set(1) // the margin before any feedback
	return r
}
