// Package metrics defines every Prometheus metric kvroute exports, in one place, one
// file per area. Registries are injected (never the global default registerer) so
// that each test and each in-process simulation uses a fresh one.
//
// Conventions: names carry units (_seconds, _bytes, _tokens, _total); label values
// are bounded — worker names and model names come from configuration, never from
// client input (an unknown model is reported as "other").
package metrics

import "github.com/prometheus/client_golang/prometheus"

// Namespace prefixes every kvroute metric name.
const Namespace = "kvroute"

// Set holds all kvroute metrics.
type Set struct {
	Router    *Router
	ExtProc   *ExtProc
	Index     *Index
	Tokenize  *Tokenize
	Scoring   *Scoring
	Workers   *Workers
	Peers     *Peers
	Admission *Admission
	Classify  *Classify
}

// New creates every metric and registers it on reg.
func New(reg prometheus.Registerer) *Set {
	return &Set{
		Router:    newRouter(reg),
		ExtProc:   newExtProc(reg),
		Index:     newIndex(reg),
		Tokenize:  newTokenize(reg),
		Scoring:   newScoring(reg),
		Workers:   newWorkers(reg),
		Peers:     newPeers(reg),
		Admission: newAdmission(reg),
		Classify:  newClassify(reg),
	}
}

// NewUnregistered returns a Set registered on a fresh private registry, for tests and
// in-process simulations that do not export metrics.
func NewUnregistered() *Set { return New(prometheus.NewRegistry()) }

// LatencyBuckets are histogram buckets in seconds for TTFT and end-to-end latency:
// 5 ms … ~164 s.
var LatencyBuckets = prometheus.ExponentialBuckets(0.005, 2, 16)

// FastBuckets are histogram buckets in seconds for kvroute's own work (decisions,
// tokenization, ext_proc overhead): 1 µs … ~0.5 s.
var FastBuckets = prometheus.ExponentialBuckets(1e-6, 2.5, 15)

func must[T prometheus.Collector](reg prometheus.Registerer, c T) T {
	reg.MustRegister(c)
	return c
}
