package admission

import (
	"time"

	"github.com/kvroute/kvroute/config"
)

func modelLimits(ts []config.TenantLimits) map[histKey]config.ModelLimits {
	out := map[histKey]config.ModelLimits{}
	for _, t := range ts {
		for _, m := range t.Models {
			out[histKey{t.Name, m.Model}] = m
		}
	}
	return out
}

// planOf is what a reservation of cost for tenant × model checks and charges: the
// tenant-wide minute counter (always, limit 0 counts only), the tenant's other token
// windows, the tenant × model ones, requests per minute and concurrency.
func (a *Admitter) planOf(tenant, model string, cost int64) plan {
	lim := a.LimitsOf(tenant)
	p := plan{tenant: tenant, lim: lim, rpm: lim.RequestsPerMinute, conc: lim.MaxConcurrent, cost: cost}
	p.tokens = append(p.tokens, tokenLimit{window: window, limit: lim.TokensPerMinute})
	for _, w := range lim.TokenWindows {
		p.tokens = append(p.tokens, tokenLimit{window: w.Window, limit: w.Tokens})
	}
	if m, ok := a.models[histKey{tenant, model}]; ok {
		if m.TokensPerMinute > 0 {
			p.tokens = append(p.tokens, tokenLimit{model: model, window: window, limit: m.TokensPerMinute})
		}
		for _, w := range m.TokenWindows {
			p.tokens = append(p.tokens, tokenLimit{model: model, window: w.Window, limit: w.Tokens})
		}
	}
	return p
}

// budgeted reports whether tenant has any token limit (its settlement then counts
// streamed tokens).
func (a *Admitter) budgeted(tenant string) bool {
	lim := a.LimitsOf(tenant)
	if lim.TokensPerMinute > 0 || len(lim.TokenWindows) > 0 {
		return true
	}
	for k := range a.models {
		if k.tenant == tenant {
			return true
		}
	}
	return false
}

// reserve asks the backend; when the redis backend cannot be asked (it failed, or
// counts as down for retry_interval after a failure) the tenant's redis_down mode
// decides, counted in kvroute_admission_backend_down_total{mode}:
//   - local: the reservation is checked against an in-memory budget of 1/replicas of
//     every limit (so N replicas together stay within the limit while Redis is down);
//   - fail_open: admitted without a budget (its settlement charges nothing);
//   - fail_closed: refused, 503 with Retry-After retry_interval.
func (a *Admitter) reserve(p plan, now time.Time) (Reservation, *Refusal) {
	res, ref, err := a.budget.reserve(p, now)
	if err == nil {
		return res, ref
	}
	mode := p.lim.RedisDown
	if mode == "" {
		mode = a.cfg.Redis.Down
	}
	a.m.BackendDown.WithLabelValues(mode).Inc()
	switch mode {
	case "fail_open":
		return Reservation{Tenant: p.tenant, Tokens: p.cost}, nil
	case "fail_closed":
		return Reservation{}, &Refusal{Reason: "unavailable", Reset: a.cfg.Redis.RetryInterval}
	}
	res, ref, _ = a.redis.fallback.reserve(p.scaled(a.cfg.Redis.Replicas), now)
	return res, ref
}

// settle settles r with the backend that holds it (none for fail_open); a failed
// redis settlement is counted (kvroute_admission_backend_errors_total{op="settle"})
// and lost: the reservation stays charged and its concurrency slot expires after
// admission.redis.ticket_ttl.
func (a *Admitter) settle(r Reservation, actual int64) {
	if r.via == nil {
		return
	}
	_ = r.via.settle(r, actual, a.now())
}
