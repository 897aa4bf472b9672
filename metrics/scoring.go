package metrics

import "github.com/prometheus/client_golang/prometheus"

// Scoring holds the scoring metrics. Owned by the scoring area; add fields here, register them in newScoring.
type Scoring struct {
	reg prometheus.Registerer
}

func newScoring(reg prometheus.Registerer) *Scoring {
	return &Scoring{reg: reg}
}
