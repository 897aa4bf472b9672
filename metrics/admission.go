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
	// (429), unauthenticated (401), unavailable (503: redis_down fail_closed).
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
	// BackendErrors counts failed calls to the redis budget backend by op (reserve,
	// settle): a timeout, a refused connection, an error reply.
	BackendErrors *prometheus.CounterVec // op
	// BackendDown counts reservations decided without the redis backend (it failed or
	// counts as down), by the tenant's redis_down mode: local (1/replicas of the budget
	// enforced in memory), fail_open (admitted unbudgeted), fail_closed (refused, 503).
	BackendDown *prometheus.CounterVec // mode
}

// tenantBound is the tenant label's bound, said in every help text that uses it.
const tenantBound = ` The tenant label is bounded: configured admission.metrics_tenants and the first admission.metrics_max_tenants seen, every other tenant "other".`

func newAdmission(reg prometheus.Registerer) *Admission {
	const sub = "admission"
	return &Admission{
		Requests: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "requests_total", Help: "Requests by tenant (bounded) and outcome, once each when settled or refused." + tenantBound}, []string{"tenant", "outcome"})),
		Refused: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "refused_total", Help: "Requests refused by admission, by tenant (bounded) and reason (tokens, requests, concurrency, unauthenticated, unavailable: fail_closed while the redis budget backend is down)." + tenantBound}, []string{"tenant", "reason"})),
		TokensReserved: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "reserved_tokens_total", Help: "Token cost reserved at admission, by tenant (bounded)." + tenantBound}, []string{"tenant"})),
		TokensSettled: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "settled_tokens_total", Help: "Tokens settled on completion, by tenant (bounded) and kind (uncached, cached, output)." + tenantBound}, []string{"tenant", "kind"})),
		Settlements: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "settlements_total", Help: "Settlements by usage_source (reported, counted, estimated, released)."}, []string{"usage_source"})),
		UntrustedIdentity: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "untrusted_identity_total", Help: "Identity claims ignored as untrusted, by source (header from an untrusted peer, unknown api_key)."}, []string{"source"})),
		BackendErrors: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "backend_errors_total", Help: "Failed calls to the redis budget backend, by op (reserve, settle)."}, []string{"op"})),
		BackendDown: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "backend_down_total", Help: "Reservations decided while the redis budget backend was unreachable, by redis_down mode (local: 1/replicas of the budget in memory, fail_open, fail_closed)."}, []string{"mode"})),
	}
}
