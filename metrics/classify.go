package metrics

import "github.com/prometheus/client_golang/prometheus"

// Classify holds the classify stage's metrics (package classify's Rules).
//
// Label values are bounded: rule is a configured rule name or "none", label one of the
// loaded model's labels or "none", action one of none/refuse/class/workers/tag.
type Classify struct {
	Decisions *prometheus.CounterVec // rule, label, action: requests through the classify stage
}

func newClassify(reg prometheus.Registerer) *Classify {
	const sub = "classify"
	return &Classify{
		Decisions: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "decisions_total", Help: "Requests through the classify stage, by the rule that matched (none), the linear model's label (none without a model) and the action taken (none, refuse, class, workers, tag)."},
			[]string{"rule", "label", "action"})),
	}
}
