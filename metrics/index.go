package metrics

import "github.com/prometheus/client_golang/prometheus"

// Index holds the index metrics. Owned by the index area; add fields here, register them in newIndex.
type Index struct {
	reg prometheus.Registerer
}

func newIndex(reg prometheus.Registerer) *Index {
	return &Index{reg: reg}
}
