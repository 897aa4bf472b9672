package metrics

import "github.com/prometheus/client_golang/prometheus"

// Admission holds the admission stage's metrics (package admission). The tenant label
// is bounded: a tenant gets its own value only when listed in
// admission.metrics_tenants or among the first admission.metrics_max_tenants seen;
// every other tenant is "other" (admission.Labeler).
type Admission struct {
	// Requests counts requests once each when settled or refused, by tenant and
	// outcome (response.Outcome; rejected when admission or the router refused it).
	Requests *prometheus.CounterVec // tenant, outcome
	// Refused counts refusals by tenant and reason: tokens, requests, concurrency
	// (429), unauthenticated (401).
	Refused *prometheus.CounterVec // tenant, reason
	// TokensReserved counts token cost reserved at admission, by tenant.
	TokensReserved *prometheus.CounterVec // tenant
	// TokensSettled counts tokens settled on completion, by tenant and kind (uncached,
	// cached, output; raw tokens, before weights).
	TokensSettled *prometheus.CounterVec // tenant, kind
	// Settlements counts settlements by usage_source: reported (the engine's usage),
	// counted (generated tokens counted from the stream), estimated (the reservation
	// stands), released (nothing was sent to a worker).
	Settlements *prometheus.CounterVec // usage_source
	// UntrustedIdentity counts identity claims ignored because they came from a source
	// that cannot be trusted (source header: a tenant header from a peer outside
	// admission.trusted_peers; api_key: a key not in the key file).
	UntrustedIdentity *prometheus.CounterVec // source

	// QueueSeconds observes how long each request of a class with a queue waited in
	// kvroute's queue (0 when it was picked at once), by tenant (bounded) and class,
	// when it left the queue (dispatched, refused or its client gone).
	QueueSeconds *prometheus.HistogramVec // tenant, class
	// QueueDepth is the number of requests waiting in kvroute's queue, by class.
	QueueDepth *prometheus.GaugeVec // class
	// QueueRejected counts requests the queue refused, by class and reason
	// (queue_full, queue_shed, queue_timeout: x-kvroute-rejected-reason).
	QueueRejected *prometheus.CounterVec // class, reason
}

// tenantBound is the tenant label's bound, said in every help text that uses it.
const tenantBound = ` The tenant label is bounded: configured admission.metrics_tenants and the first admission.metrics_max_tenants seen, every other tenant "other".`

func newAdmission(reg prometheus.Registerer) *Admission {
	const sub = "admission"
	return &Admission{
		Requests: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "requests_total", Help: "Requests by tenant (bounded) and outcome, once each when settled or refused." + tenantBound}, []string{"tenant", "outcome"})),
		Refused: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "refused_total", Help: "Requests refused by admission, by tenant (bounded) and reason (tokens, requests, concurrency, unauthenticated)." + tenantBound}, []string{"tenant", "reason"})),
		TokensReserved: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "reserved_tokens_total", Help: "Token cost reserved at admission, by tenant (bounded)." + tenantBound}, []string{"tenant"})),
		TokensSettled: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "settled_tokens_total", Help: "Tokens settled on completion, by tenant (bounded) and kind (uncached, cached, output)." + tenantBound}, []string{"tenant", "kind"})),
		Settlements: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "settlements_total", Help: "Settlements by usage_source (reported, counted, estimated, released)."}, []string{"usage_source"})),
		UntrustedIdentity: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "untrusted_identity_total", Help: "Identity claims ignored as untrusted, by source (header from an untrusted peer, unknown api_key)."}, []string{"source"})),
		QueueSeconds: must(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: sub,
			Name: "queue_seconds", Help: "Time requests of a class with a queue waited in kvroute's queue (0 when picked at once), by tenant (bounded) and class." + tenantBound,
			Buckets: []float64{0, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60}}, []string{"tenant", "class"})),
		QueueDepth: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "queue_depth", Help: "Requests waiting in kvroute's queue, by class."}, []string{"class"})),
		QueueRejected: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "queue_rejected_total", Help: "Requests refused by kvroute's queue, by class and reason (queue_full, queue_shed, queue_timeout)."}, []string{"class", "reason"})),
	}
}
