package metrics

import "github.com/prometheus/client_golang/prometheus"

// Tokenize holds the tokenize metrics (package tokenize's Service).
//
// Label values are bounded: model comes from configuration ("other" for a request
// naming an unconfigured model), path is one of given/local/remote/none, reason is one
// of a fixed set documented in docs/metrics.md.
type Tokenize struct {
	Requests        *prometheus.CounterVec   // model, path: requests served by that path (none = degraded)
	Failures        *prometheus.CounterVec   // model, path, reason: a path tried and failed (the next one is tried)
	Degraded        *prometheus.CounterVec   // model, reason: requests left without token ids (pick on load alone)
	Duration        *prometheus.HistogramVec // path: time to tokenize one request by that path
	Tokens          *prometheus.CounterVec   // path: prompt tokens produced
	CacheHits       *prometheus.CounterVec   // model: segment cache hits
	CacheMisses     *prometheus.CounterVec   // model: segment cache misses
	CacheHitBytes   *prometheus.CounterVec   // model: text bytes whose ids came from the cache
	CacheBytes      *prometheus.GaugeVec     // model: charged size of the segment cache
	CacheEvictions  *prometheus.CounterVec   // model: cache entries evicted by the byte bound
	LocalAvailable  *prometheus.GaugeVec     // model: 1 when the in-process tokenizer loaded
	ChatTemplateUse *prometheus.GaugeVec     // model: 1 when the chat template compiled and renders
	ShadowChecks    *prometheus.CounterVec   // model, result: shadow checks of local ids against a worker's /tokenize
	ShadowRemote    *prometheus.GaugeVec     // model: 1 while the shadow check has switched the model to its remote path
	ShadowLoadOnly  *prometheus.GaugeVec     // model: 1 while the shadow check has switched a model without a remote path to load-only picks
	// The render cache (incremental chat rendering, tokenize.render_cache_bytes).
	RenderHits          *prometheus.CounterVec // model: chat requests rendered from a cached conversation prefix
	RenderMisses        *prometheus.CounterVec // model: chat requests rendered in full
	RenderBytes         *prometheus.GaugeVec   // model: charged size of the render cache
	RenderEvictions     *prometheus.CounterVec // model: prefixes evicted by the byte bound
	RenderDisagreements *prometheus.CounterVec // model: sampled fast-path renders that differed from a full render
	RenderOff           *prometheus.GaugeVec   // model: 1 once a disagreement has turned the render cache off
}

func newTokenize(reg prometheus.Registerer) *Tokenize {
	const sub = "tokenize"
	return &Tokenize{
		Requests: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "requests_total", Help: "Requests tokenized, by model and the path that produced the ids (given, local, remote; none = degraded)."}, []string{"model", "path"})),
		Failures: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "failures_total", Help: "Tokenization paths tried that failed, by model, path and reason; the next configured path is tried."}, []string{"model", "path", "reason"})),
		Degraded: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "degraded_total", Help: "Requests left without token ids (picked on load alone), by model and reason."}, []string{"model", "reason"})),
		Duration: must(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: sub,
			Name: "duration_seconds", Help: "Time to tokenize one request, by the path that was tried (failed attempts included).", Buckets: FastBuckets}, []string{"path"})),
		Tokens: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "prompt_tokens_total", Help: "Prompt tokens produced, by path."}, []string{"path"})),
		CacheHits: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "prefix_cache_hits_total", Help: "Text runs between special tokens whose ids came from the segment cache, by model."}, []string{"model"})),
		CacheMisses: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "prefix_cache_misses_total", Help: "Cacheable text runs encoded because the segment cache did not hold them, by model."}, []string{"model"})),
		CacheHitBytes: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "prefix_cache_hit_bytes_total", Help: "Text bytes whose token ids came from the segment cache, by model."}, []string{"model"})),
		CacheBytes: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "prefix_cache_bytes", Help: "Charged size of the segment cache in bytes, by model."}, []string{"model"})),
		CacheEvictions: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "prefix_cache_evictions_total", Help: "Segment cache entries evicted by the byte bound, by model."}, []string{"model"})),
		LocalAvailable: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "local_available", Help: "1 when the model's in-process tokenizer loaded, 0 when not (see /debug/tokenize for why)."}, []string{"model"})),
		ChatTemplateUse: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "chat_template_available", Help: "1 when the model's chat template compiled and renders in process, 0 when chat requests need another path."}, []string{"model"})),
		ShadowChecks: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "shadow_checks_total", Help: "Shadow checks of local token ids against the picked worker's POST /tokenize, by model and result (match, mismatch, error, dropped)."}, []string{"model", "result"})),
		ShadowRemote: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "shadow_remote", Help: "1 while the shadow check's mismatch rate has switched the model from its local to its remote tokenization path (until restart or POST /admin/tokenize/reset)."}, []string{"model"})),
		ShadowLoadOnly: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "shadow_load_only", Help: "1 while the shadow check's mismatch rate has switched a model with no remote tokenization path to load-only picks, without prefix-cache scoring (until restart or POST /debug/tokenize/reset)."}, []string{"model"})),
		RenderHits: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "render_cache_hits_total", Help: "Chat requests whose conversation prefix was rendered and tokenized from the render cache (only the new messages rendered), by model."}, []string{"model"})),
		RenderMisses: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "render_cache_misses_total", Help: "Chat requests rendered in full (no cached prefix, or the template is not proven prefix-stable for them), by model."}, []string{"model"})),
		RenderBytes: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "render_cache_bytes", Help: "Charged size of the render cache in bytes (text and ids of cached conversation prefixes), by model."}, []string{"model"})),
		RenderEvictions: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "render_cache_evictions_total", Help: "Conversation prefixes evicted from the render cache by its byte bound, by model."}, []string{"model"})),
		RenderDisagreements: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "render_cache_disagreements_total", Help: "Sampled incremental renders that differed from a full render (each turns the render cache off), by model."}, []string{"model"})),
		RenderOff: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "render_cache_off", Help: "1 once a disagreement has turned the model's render cache off (every chat request is then rendered in full), by model."}, []string{"model"})),
	}
}
