package metrics

import "github.com/prometheus/client_golang/prometheus"

// Scoring holds the scoring metrics (TTFT predictions, learning, picks) and the vLLM
// /metrics scraper's metrics (workers/scrape.go was built with scoring).
type Scoring struct {
	// PredictedTTFT is the predicted time to first token of the chosen worker at pick time
	// (label worker), seconds. Explain (dry-run) picks are not recorded.
	PredictedTTFT *prometheus.HistogramVec
	// ObservedTTFT is the observed time to first token handed back for learning (label
	// worker), seconds.
	ObservedTTFT *prometheus.HistogramVec
	// APE is |predicted − observed| / observed per learned observation (label worker), a ratio.
	APE *prometheus.HistogramVec
	// PrefillRate is the learned prefill rate (label worker), uncached tokens per second.
	PrefillRate *prometheus.GaugeVec
	// Overhead is the learned fixed per-request time (label worker), seconds.
	Overhead *prometheus.GaugeVec
	// Factor is a learned dimensionless multiplier on a term's prior (labels worker, term:
	// queue, lower_tier, decode_interference, adapter). 1 means the prior was right.
	Factor *prometheus.GaugeVec
	// Observations counts observations offered for learning (labels worker, result:
	// learned, clipped — learned with a clipped residual —, skipped).
	Observations *prometheus.CounterVec
	// Picks counts decisions by policy and reason (best, tie, slo, degraded, explore, policy).
	// Shed requests and explain (dry-run) picks are not counted.
	Picks *prometheus.CounterVec
	// AdapterPicks counts picks of LoRA requests by the chosen worker's adapter state
	// (label state: loaded, free_slot — loaded into a free slot —, evict — loaded in
	// place of an idle adapter —, blocked — every slot held by running adapters). Explain
	// (dry-run) picks are not counted.
	AdapterPicks *prometheus.CounterVec
	// Shed counts requests refused because even the best prediction exceeded the limit.
	Shed *prometheus.CounterVec
	// CachedTokensError is |engine-reported cached_tokens − index-predicted cached tokens|
	// for finished requests whose usage reported a cached-token count (0 included; absent or null is not compared), tokens.
	CachedTokensError prometheus.Histogram
	// CachedTokensMismatch counts finished requests where the index and the engine
	// disagree (direction: index_over — the index promised more than the engine reused —,
	// index_under).
	CachedTokensMismatch *prometheus.CounterVec

	// ScrapeDuration is the time of one vLLM /metrics scrape (label worker), seconds.
	ScrapeDuration *prometheus.HistogramVec
	// ScrapeErrors counts failed scrapes (labels worker, reason: http, timeout, status,
	// parse, starved — a timeout while kvroute itself ran late, not counted for health).
	ScrapeErrors *prometheus.CounterVec
	// ScrapeHealthy is 1 while a worker's scrapes succeed, 0 once it is marked unhealthy.
	ScrapeHealthy *prometheus.GaugeVec
}

func newScoring(reg prometheus.Registerer) *Scoring {
	const sub = "scoring"
	w := []string{"worker"}
	return &Scoring{
		PredictedTTFT: must(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: sub,
			Name: "predicted_ttft_seconds", Help: "Predicted time to first token of the chosen worker at pick time.", Buckets: LatencyBuckets}, w)),
		ObservedTTFT: must(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: sub,
			Name: "observed_ttft_seconds", Help: "Observed time to first token handed to the predictor for learning (gen_ai.server.time_to_first_token).", Buckets: LatencyBuckets}, w)),
		APE: must(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: sub,
			Name: "prediction_abs_percentage_error_ratio", Help: "Absolute percentage error of the TTFT prediction, |predicted-observed|/observed.",
			Buckets: []float64{0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10}}, w)),
		PrefillRate: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "prefill_tokens_per_second", Help: "Learned prefill rate of uncached prompt tokens."}, w)),
		Overhead: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "overhead_seconds", Help: "Learned fixed per-request time to first token."}, w)),
		Factor: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "term_factor_ratio", Help: "Learned multiplier on a TTFT term's prior (queue, lower_tier, decode_interference, adapter); 1 = prior."}, []string{"worker", "term"})),
		Observations: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "observations_total", Help: "First-token observations offered for learning, by result (learned, clipped, skipped)."}, []string{"worker", "result"})),
		AdapterPicks: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "adapter_picks_total", Help: "Picks of LoRA-adapter requests by the chosen worker's adapter state (loaded, free_slot, evict, blocked)."}, []string{"state"})),
		Picks: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "picks_total", Help: "Scoring decisions by policy and reason (best, tie, slo, degraded, explore, policy)."}, []string{"policy", "reason"})),
		Shed: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "shed_total", Help: "Requests refused (429) because even the best predicted TTFT exceeded the limit."}, []string{"policy"})),
		CachedTokensError: must(reg, prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: sub,
			Name: "cached_tokens_error_tokens", Help: "|engine usage cached_tokens - index-predicted cached tokens| of finished requests reporting a cached-token count (0 included).",
			Buckets: []float64{0, 16, 64, 256, 1024, 4096, 16384, 65536}})),
		CachedTokensMismatch: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "cached_tokens_mismatch_total", Help: "Finished requests where index and engine disagree on cached tokens (index_over, index_under)."}, []string{"direction"})),
		ScrapeDuration: must(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: "workers",
			Name: "scrape_duration_seconds", Help: "Time of one vLLM /metrics scrape.", Buckets: FastBuckets}, w)),
		ScrapeErrors: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: "workers",
			Name: "scrape_errors_total", Help: "Failed vLLM /metrics scrapes by reason (http, timeout, status, parse; starved: timed out while kvroute itself ran late, not counted against the worker)."}, []string{"worker", "reason"})),
		ScrapeHealthy: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: "workers",
			Name: "scrape_healthy", Help: "1 while a worker's /metrics scrapes succeed; 0 once consecutive failures marked it unhealthy."}, w)),
	}
}
