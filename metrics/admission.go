package metrics

import "github.com/prometheus/client_golang/prometheus"

// Admission holds the admission stage's metrics (package admission). The per-tenant
// ones carry the labels tenant and class, both from admission.Labeler.Labels, the one
// place that bounds them: a tenant gets its own value only when listed in
// admission.metrics_tenants or among the first admission.metrics_max_tenants seen
// (every other tenant is "other"); class is the request's QoS class, "default" until
// one is assigned. docs/metrics.md states the series count per tenant and class,
// measured by admission's tests.
type Admission struct {
	// Requests counts requests once each when settled or refused, by tenant, class and
	// outcome (response.Outcome; rejected when admission or the router refused it).
	Requests *prometheus.CounterVec // tenant, class, outcome
	// Refused counts refusals by tenant, class and reason: tokens, requests,
	// concurrency (429), unauthenticated (401), unavailable (503: redis_down fail_closed).
	Refused *prometheus.CounterVec // tenant, class, reason
	// TokensReserved counts tokens reserved at admission, by tenant, class and kind:
	// uncached and cached prompt tokens (the router's counts for the picked worker) and
	// the output estimate; raw tokens, before weights.
	TokensReserved *prometheus.CounterVec // tenant, class, kind
	// TokensSettled counts tokens settled on completion, by tenant, class and kind
	// (uncached, cached, output; raw tokens, before weights).
	TokensSettled *prometheus.CounterVec // tenant, class, kind
	// TTFT is the time to first token of admitted requests by tenant and class,
	// seconds: the router's observation (router.Ticket.FirstToken), from the request's
	// start to the first generated token.
	TTFT *prometheus.HistogramVec // tenant, class
	// Settlements counts settlements by usage_source: reported (the engine's usage),
	// counted (generated tokens counted from the stream), estimated (the reservation
	// stands), released (nothing was sent to a worker).
	Settlements *prometheus.CounterVec // usage_source
	// UntrustedIdentity counts identity claims ignored because they came from a source
	// that cannot be trusted (source header: a tenant header from a peer outside
	// admission.trusted_peers; api_key: a key not in the key file).
	UntrustedIdentity *prometheus.CounterVec // source
	// AuthThrottled counts API-key requests refused (429) because their client address
	// presented too many unknown keys (admission.auth_throttle).
	AuthThrottled prometheus.Counter
	// BackendErrors counts failed calls to the redis budget backend by op (reserve,
	// settle): a timeout, a refused connection, an error reply.
	BackendErrors *prometheus.CounterVec // op
	// BackendDown counts reservations decided without the redis backend (it failed or
	// counts as down), by the tenant's redis_down mode: local (1/replicas of the budget
	// enforced in memory), fail_open (admitted unbudgeted), fail_closed (refused, 503).
	BackendDown *prometheus.CounterVec // mode
	// RedisLeases is the number of reservations this replica holds in the redis budget
	// backend and renews (admission.redis.lease_ttl): requests admitted, not yet settled.
	RedisLeases prometheus.Gauge

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
const tenantBound = ` The tenant label is bounded: configured admission.metrics_tenants and the first admission.metrics_max_tenants seen, every other tenant "other"; class is the QoS class ("default" without one).`

func newAdmission(reg prometheus.Registerer) *Admission {
	const sub = "admission"
	return &Admission{
		Requests: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "requests_total", Help: "Requests by tenant (bounded), class and outcome, once each when settled or refused." + tenantBound}, []string{"tenant", "class", "outcome"})),
		Refused: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "refused_total", Help: "Requests refused by admission, by tenant (bounded), class and reason (tokens, requests, concurrency, unauthenticated, auth_throttled, slo_miss: no worker predicted within the class objective under on_slo_miss refuse or scoring.shed_on_slo_miss, unavailable: fail_closed while the redis budget backend is down)." + tenantBound}, []string{"tenant", "class", "reason"})),
		TokensReserved: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "reserved_tokens_total", Help: "Tokens reserved at admission, by tenant (bounded), class and kind (uncached, cached: prompt tokens as the router counted them for the picked worker; output: the estimate), raw before weights." + tenantBound}, []string{"tenant", "class", "kind"})),
		TokensSettled: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "settled_tokens_total", Help: "Tokens settled on completion, by tenant (bounded), class and kind (uncached, cached, output), raw before weights." + tenantBound}, []string{"tenant", "class", "kind"})),
		TTFT: must(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: sub,
			Name: "time_to_first_token_seconds", Help: "Time to first token of admitted requests by tenant (bounded) and class, seconds (the router's observation at the first generated token)." + tenantBound,
			Buckets: LatencyBuckets}, []string{"tenant", "class"})),
		Settlements: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "settlements_total", Help: "Settlements by usage_source (reported, counted, estimated, released)."}, []string{"usage_source"})),
		UntrustedIdentity: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "untrusted_identity_total", Help: "Identity claims ignored as untrusted, by source (header from an untrusted peer, unknown api_key)."}, []string{"source"})),
		AuthThrottled: must(reg, prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "auth_throttled_total", Help: "API-key requests refused (429) before the key was looked at: their client address (IPv6 /64) presented admission.auth_throttle.failures unknown keys within its window."})),
		BackendErrors: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "backend_errors_total", Help: "Failed calls to the redis budget backend, by op (reserve, settle — retries included; renew: a lease renewal; settle_dropped: a settlement the full retry queue could not take, its lease then ends at `lease_ttl`)."}, []string{"op"})),
		BackendDown: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "backend_down_total", Help: "Reservations decided while the redis budget backend was unreachable, by redis_down mode (local: 1/replicas of the budget in memory, fail_open, fail_closed)."}, []string{"mode"})),
		RedisLeases: must(reg, prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "redis_leases", Help: "Reservations this replica holds in the redis budget backend and renews every admission.redis.lease_ttl/3 (admitted, not yet settled)."})),
		QueueSeconds: must(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: sub,
			Name: "queue_seconds", Help: "Time requests of a class with a queue waited in kvroute's queue (0 when picked at once), by tenant (bounded) and class." + tenantBound,
			Buckets: []float64{0, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60}}, []string{"tenant", "class"})),
		QueueDepth: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "queue_depth", Help: "Requests waiting in kvroute's queue, by class."}, []string{"class"})),
		QueueRejected: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "queue_rejected_total", Help: "Requests refused by kvroute's queue, by class and reason (queue_full, queue_shed, queue_timeout)."}, []string{"class", "reason"})),
	}
}
