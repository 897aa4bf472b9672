package metrics

import "github.com/prometheus/client_golang/prometheus"

// Classify holds the classify stage's metrics (package classify's Rules).
//
// Label values are bounded: rule is a configured rule name or "none", label one of the
// loaded model's labels or "none", action one of none/unavailable/refuse/class/workers/model/tag,
// outcome a fixed word.
type Classify struct {
	Decisions *prometheus.CounterVec // rule, label, action: requests through the classify stage
	Rewrites  *prometheus.CounterVec // rule, outcome (applied, skipped): model rewrites
	// RemoteRequests: answers of the remote classifier, by outcome (ok, cached, timeout, error)
	RemoteRequests *prometheus.CounterVec
	ModelReloads   *prometheus.CounterVec // outcome (ok, error, rejected): classify.model reloads
}

func newClassify(reg prometheus.Registerer) *Classify {
	const sub = "classify"
	return &Classify{
		Decisions: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "decisions_total", Help: "Requests through the classify stage, by the rule that matched (none), the linear model's label (none without a model) and the action taken (none, unavailable: a fail-closed rule whose remote classifier did not answer, refuse, class, workers, model, tag)."},
			[]string{"rule", "label", "action"})),
		Rewrites: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "rewrites_total", Help: "Model rewrites decided by a classify rule, by rule and outcome: applied (the body sent upstream and the pick carry the rule's model) or skipped (the front could not replace the body: ext_proc in a request body mode other than BUFFERED or FULL_DUPLEX_STREAMED, or a body that is not a JSON object)."},
			[]string{"rule", "outcome"})),
		RemoteRequests: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "remote_requests_total", Help: "Texts given to the remote classifier (classify.remote), by outcome: ok (a call answered), cached (answered from the cache, no call), timeout (the call or the wait for a slot ran past classify.remote.timeout) or error (a failed call: status, reply, connection)."},
			[]string{"outcome"})),
		ModelReloads: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "model_reloads_total", Help: "Reloads of classify.model after the file changed (classify.reload_interval), by outcome: ok (in use from the next request), error (the file did not load) or rejected (it lacks a label a rule matches on); on error and rejected the model in use is kept."},
			[]string{"outcome"})),
	}
}
