package metrics

import "github.com/prometheus/client_golang/prometheus"

// Workers holds the workers metrics. Owned by the workers area; add fields here, register them in newWorkers.
type Workers struct {
	reg prometheus.Registerer
}

func newWorkers(reg prometheus.Registerer) *Workers {
	return &Workers{reg: reg}
}
