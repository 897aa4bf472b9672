package metrics

import "github.com/prometheus/client_golang/prometheus"

// ExtProc holds the extproc metrics. Owned by the extproc area; add fields here, register them in newExtProc.
type ExtProc struct {
	reg prometheus.Registerer
}

func newExtProc(reg prometheus.Registerer) *ExtProc {
	return &ExtProc{reg: reg}
}
