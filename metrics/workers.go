package metrics

import "github.com/prometheus/client_golang/prometheus"

// Workers holds the worker discovery metrics. Label "source" is one of static,
// kubernetes, dns; "state" is ready or not_ready; "reason" is a fixed error class
// (workers.DiscoveryError*), never free text.
type Workers struct {
	// Discovered counts the endpoints the last refresh saw, by source and state.
	// not_ready endpoints (Kubernetes readiness, terminating pods) are not routed to.
	Discovered *prometheus.GaugeVec // source, state
	// Refreshes counts snapshots a discovery source applied to the registry.
	Refreshes *prometheus.CounterVec // source
	// Errors counts failed refreshes and skipped endpoints, by class.
	Errors *prometheus.CounterVec // source, reason
	// LastRefresh is the Unix time of the last applied snapshot, in seconds.
	LastRefresh *prometheus.GaugeVec // source
}

// DiscoverySources are the values of the "source" label.
var DiscoverySources = []string{"static", "kubernetes", "dns"}

func newWorkers(reg prometheus.Registerer) *Workers {
	const sub = "discovery"
	return &Workers{
		Discovered: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "workers", Help: "Worker endpoints seen by the last discovery refresh, by source and state (ready, not_ready); only ready ones are routed to."}, []string{"source", "state"})),
		Refreshes: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "refreshes_total", Help: "Worker sets applied to the registry by a discovery source."}, []string{"source"})),
		Errors: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "errors_total", Help: "Discovery failures by source and class (lookup, no_port, bad_address); the previous worker set is kept on lookup failures."}, []string{"source", "reason"})),
		LastRefresh: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "last_refresh_timestamp_seconds", Help: "Unix time of the last worker set a discovery source applied, seconds."}, []string{"source"})),
	}
}
