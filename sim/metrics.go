package sim

import (
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// workerMetrics are the vLLM metrics one simulated worker exports
// (vllm/v1/metrics/loggers.py PrometheusStatLogger), labels model_name and engine.
type workerMetrics struct {
	ttft, itl, e2e          prometheus.Observer
	promptTokens, genTokens prometheus.Counter
	success                 prometheus.Counter
	// bySource counts prompt tokens by where their KV came from (vLLM
	// vllm:prompt_tokens_by_source_total: local_compute, local_cache_hit,
	// external_kv_transfer).
	sources *prometheus.CounterVec
}

// bySource counts the prompt tokens of a request's first output by source.
func (m *workerMetrics) bySource(promptLen int, o Output) {
	m.sources.WithLabelValues("local_compute").Add(float64(promptLen - o.CachedTokens))
	m.sources.WithLabelValues("local_cache_hit").Add(float64(o.CachedTokens - o.RemoteTokens))
	m.sources.WithLabelValues("external_kv_transfer").Add(float64(o.RemoteTokens))
}

// latency buckets as vLLM uses them for time_to_first_token_seconds (seconds).
var ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
var itlBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
var e2eBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}

func newWorkerMetrics(reg *prometheus.Registry, model string, prof Profile, stats func() Stats) *workerMetrics {
	l := prometheus.Labels{"model_name": model, "engine": "0"}
	gauge := func(name, help string, f func(Stats) float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: l}, func() float64 { return f(stats()) }))
	}
	counter := func(name, help string, f func(Stats) float64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: l}, func() float64 { return f(stats()) }))
	}
	gauge("vllm:num_requests_running", "Number of requests in model execution batches.", func(s Stats) float64 { return float64(s.Running) })
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", func(s Stats) float64 { return float64(s.Waiting) })
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", func(s Stats) float64 { return s.KVUsage })
	counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", func(s Stats) float64 { return float64(s.PrefixQueries) })
	counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", func(s Stats) float64 { return float64(s.PrefixHits) })
	counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", func(s Stats) float64 { return float64(s.Preemptions) })
	info := prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
		ConstLabels: prometheus.Labels{"block_size": strconv.Itoa(prof.BlockSize), "num_gpu_blocks": strconv.Itoa(prof.NumBlocks),
			"enable_prefix_caching": "True", "engine": "0"}})
	info.Set(1)
	reg.MustRegister(info)
	hist := func(name, help string, b []float64) prometheus.Observer {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: b, ConstLabels: l})
		reg.MustRegister(h)
		return h
	}
	ctr := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: l})
		reg.MustRegister(c)
		return c
	}
	sources := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:prompt_tokens_by_source_total",
		Help: "Number of prompt tokens by source.", ConstLabels: l}, []string{"source"})
	reg.MustRegister(sources)
	for _, src := range []string{"local_compute", "local_cache_hit", "external_kv_transfer"} {
		sources.WithLabelValues(src)
	}
	return &workerMetrics{
		sources:      sources,
		ttft:         hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets),
		itl:          hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itlBuckets),
		e2e:          hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2eBuckets),
		promptTokens: ctr("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		genTokens:    ctr("vllm:generation_tokens_total", "Number of generation tokens processed."),
		success:      ctr("vllm:request_success_total", "Count of successfully processed requests."),
	}
}

// loraInfo exports vllm:lora_requests_info as vLLM does (vllm/v1/metrics/loggers.py):
// labels running_lora_adapters and waiting_lora_adapters (comma-joined names) and
// max_lora, valued at the current Unix time (set_to_current_time). vLLM also keeps the
// series of earlier label sets; this exports the current one only, the one a reader
// takes (the newest).
type loraInfo struct {
	max   int
	stats func() Stats
	now   func() time.Time
}

var loraInfoDesc = prometheus.NewDesc("vllm:lora_requests_info", "Running stats on lora requests.",
	[]string{"max_lora", "running_lora_adapters", "waiting_lora_adapters"}, nil)

func (l *loraInfo) Describe(ch chan<- *prometheus.Desc) { ch <- loraInfoDesc }

func (l *loraInfo) Collect(ch chan<- prometheus.Metric) {
	s := l.stats()
	ch <- prometheus.MustNewConstMetric(loraInfoDesc, prometheus.GaugeValue, float64(l.now().UnixNano())/1e9,
		strconv.Itoa(l.max), strings.Join(s.RunningLoRAs, ","), strings.Join(s.WaitingLoRAs, ","))
}
