package metrics

import "github.com/prometheus/client_golang/prometheus"

// Tokenize holds the tokenize metrics. Owned by the tokenize area; add fields here, register them in newTokenize.
type Tokenize struct {
	reg prometheus.Registerer
}

func newTokenize(reg prometheus.Registerer) *Tokenize {
	return &Tokenize{reg: reg}
}
