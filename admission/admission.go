package admission

import (
	"crypto/sha256"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/router"
)

// Options configures an Admitter.
type Options struct {
	Config  config.Admission // validated (config.Load)
	Metrics *metrics.Set     // nil: an unregistered set
	Now     func() time.Time // nil: time.Now
}

// Admitter is the admission stage. A nil *Admitter admits everything as
// Unattributed (its methods and its Grants' are nil-safe). Safe for concurrent use.
type Admitter struct {
	cfg    config.Admission
	m      *metrics.Admission
	now    func() time.Time
	peers  []netip.Prefix
	keys   map[[sha256.Size]byte]string
	limits map[string]config.Limits
	models map[histKey]config.ModelLimits // tenant × model token limits
	budget backend
	redis  *redisBackend // backend redis; nil for local
	hist   *outputHistory
	labels *Labeler
	queue  *Queue        // nil: no class has a queue
	auth   *authThrottle // nil: failed API keys not throttled
}

// New returns an Admitter; it reads the API key file when the api_key source is
// configured.
func New(opt Options) (*Admitter, error) {
	if opt.Metrics == nil {
		opt.Metrics = metrics.NewUnregistered()
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	c := opt.Config
	peers, err := config.ParsePeers(c.TrustedPeers)
	if err != nil {
		return nil, err
	}
	a := &Admitter{cfg: c, m: opt.Metrics.Admission, now: opt.Now, peers: peers, limits: map[string]config.Limits{},
		hist: newOutputHistory(c.OutputHistory), labels: NewLabeler(c.MetricsTenants, c.MetricsMaxTenants)}
	if c.APIKeysFile != "" {
		a.auth = newAuthThrottle(c.AuthThrottle.Failures, c.AuthThrottle.Window, c.AuthThrottle.MaxClients)
		if a.keys, err = LoadKeys(c.APIKeysFile); err != nil {
			return nil, err
		}
	}
	for _, t := range c.Tenants {
		a.limits[t.Name] = t.Limits
	}
	a.models = modelLimits(c.Tenants)
	a.budget = newLocal("local")
	if c.Backend == "redis" {
		if a.redis, err = newRedis(c.Redis, a.m, a.now); err != nil {
			return nil, err
		}
		a.budget = a.redis
	}
	a.queue = NewQueue(c, a.m, true)
	return a, nil
}

var errUnauthenticated = &router.Error{Status: http.StatusUnauthorized, Type: "authentication_error",
	Message: "kvroute: no tenant identity (admission.require_tenant)", Details: "kvroute_unauthenticated"}

// Want is what a request asks for, in tokens, from the router's own counts.
type Want struct {
	PromptTokens int    // router.Ticket.PromptTokens (0 unknown)
	CachedTokens int    // router.Ticket.CachedTokens: the predicted cached prefix
	MaxTokens    int    // request max_tokens; 0 absent
	Model        string // the model asked for (router.Ticket.Model): per-model limits and output history
	// Class is the request's QoS class, the class label of the per-tenant metrics
	// ("" → DefaultClass).
	Class string

	ticket *router.Ticket // WantOf's: its first token feeds the per-tenant TTFT
}

// WantOf is the Want of a picked ticket for a request with maxTokens; the grant
// observes the ticket's TTFT (router.Ticket.OnFirstToken).
func WantOf(t *router.Ticket, maxTokens int) Want {
	return Want{PromptTokens: t.PromptTokens, CachedTokens: t.CachedTokens, MaxTokens: maxTokens, Model: t.Model, ticket: t}
}

// cost prices tokens with admission.weights: w_uncached·uncached + w_cached·cached +
// w_output·output, rounded up to whole tokens.
func (a *Admitter) cost(uncached, cached, output int) int64 {
	w := a.cfg.Weights
	return int64(math.Ceil(w.Uncached*float64(max(uncached, 0)) + w.Cached*float64(max(cached, 0)) + w.Output*float64(max(output, 0))))
}

// outputEstimate is the output a request reserves: min(max_tokens,
// admission.max_output_reservation) when it gives max_tokens — what it may generate,
// so concurrent requests cannot overrun a window by more than one request's overrun
// past the cap (an estimate below max_tokens let 25 concurrent max_tokens: 300
// requests charge 3,180 of a 2,000 tokens/min budget) — else e, the learned p90 output
// of tenant × model (admission.output_history) or default_output_tokens before it has
// min_samples. Settlement replaces it with the output generated.
func (a *Admitter) outputEstimate(tenant, model string, maxTokens int) int {
	if maxTokens > 0 {
		if c := a.cfg.MaxOutputReservation; c > 0 {
			return min(maxTokens, c)
		}
		return maxTokens
	}
	e, ok := a.hist.p90(tenant, model)
	if !ok {
		e = a.cfg.DefaultOutputTokens
	}
	return e
}

// LimitsOf returns tenant's limits: its admission.tenants entry, else admission.default.
func (a *Admitter) LimitsOf(tenant string) config.Limits {
	if l, ok := a.limits[tenant]; ok {
		return l
	}
	return a.cfg.Default
}

// Reserve reserves id's budget for w: prompt cost (uncached and cached priced
// separately) + the output estimate. It returns a Grant to settle exactly once, or a
// 429 *router.Error with Retry-After and OpenAI's x-ratelimit-* headers.
func (a *Admitter) Reserve(id Identity, w Want) (*Grant, error) {
	if a == nil {
		return nil, nil
	}
	est := a.outputEstimate(id.Tenant, w.Model, w.MaxTokens)
	cached := min(max(w.CachedTokens, 0), max(w.PromptTokens, 0))
	uncached := max(w.PromptTokens-cached, 0)
	cost := a.cost(uncached, cached, est)
	res, ref := a.reserve(a.planOf(id.Tenant, w.Model, cost), a.now())
	l := a.labels.Labels(id.Tenant, w.Class)
	if ref != nil {
		a.refuse(l, ref.Reason)
		return nil, refusalError(ref, cost)
	}
	a.m.TokensReserved.WithLabelValues(l[0], l[1], "uncached").Add(float64(uncached))
	a.m.TokensReserved.WithLabelValues(l[0], l[1], "cached").Add(float64(cached))
	a.m.TokensReserved.WithLabelValues(l[0], l[1], "output").Add(float64(est))
	if w.ticket != nil {
		w.ticket.OnFirstToken(func(d time.Duration) { a.m.TTFT.WithLabelValues(l[0], l[1]).Observe(d.Seconds()) })
	}
	return &Grant{a: a, id: id, labels: l, res: res, want: w, estimate: est}, nil
}

// refuse counts a refusal under labels l (Labeler.Labels).
func (a *Admitter) refuse(l [2]string, reason string) {
	a.m.Refused.WithLabelValues(l[0], l[1], reason).Inc()
	a.m.Requests.WithLabelValues(l[0], l[1], string(response.OutcomeRejected)).Inc()
}

// The x-kvroute-rejected-reason of a budget refusal, by Refusal.Reason, and of the
// failed-API-key throttle.
const (
	ReasonTokenBudget       = "token_budget"       // tokens: a token window of the tenant (or its model) is spent
	ReasonRequestBudget     = "request_budget"     // requests: its requests per minute
	ReasonConcurrencyLimit  = "concurrency_limit"  // concurrency: its max_concurrent
	ReasonBudgetUnavailable = "budget_unavailable" // unavailable: the 503 of redis_down: fail_closed
	ReasonAuthThrottled     = "auth_throttled"     // admission.auth_throttle: too many failed API keys from the client
)

var budgetReasons = map[string]string{"tokens": ReasonTokenBudget, "requests": ReasonRequestBudget,
	"concurrency": ReasonConcurrencyLimit, "unavailable": ReasonBudgetUnavailable}

// refusalError is the 429 for r: Retry-After is the window's end for the token and
// request budgets and 1 s for concurrency; x-kvroute-rejected-reason (the refusal's
// Reason* above), then x-ratelimit-{limit,remaining,reset}-{tokens,requests} as OpenAI
// sends them (reset as a Go duration, e.g. "12.5s"), for the limits that are set.
func refusalError(r *Refusal, cost int64) *router.Error {
	retry := r.Reset
	if r.Reason == "concurrency" {
		retry = time.Second
	}
	e := &router.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_exceeded", RetryAfter: retry,
		Details: "kvroute_admission_" + r.Reason, Header: [][2]string{{RejectedReasonHeader, budgetReasons[r.Reason]}}}
	switch r.Reason {
	case "unavailable": // fail_closed while the redis budget backend is down
		e.Status, e.Type, e.Message = http.StatusServiceUnavailable, "service_unavailable", "kvroute: tenant budget backend unavailable (admission.redis, fail_closed)"
		return e
	case "tokens":
		per := "per " + windowName(r.Window)
		if r.Model != "" {
			per += " for model " + r.Model
		}
		e.Message = fmt.Sprintf("kvroute: tenant token budget exceeded: this request needs %d tokens, %d of %d %s remain", cost, r.TokensRemaining, r.TokenLimit, per)
	case "requests":
		e.Message = fmt.Sprintf("kvroute: tenant request budget exceeded: %d requests per minute", r.RequestLimit)
	default:
		e.Message = "kvroute: tenant has too many concurrent requests"
	}
	reset := r.Reset.Round(time.Millisecond).String()
	if r.RequestLimit > 0 {
		e.Header = append(e.Header, [2]string{"x-ratelimit-limit-requests", strconv.FormatInt(r.RequestLimit, 10)},
			[2]string{"x-ratelimit-remaining-requests", strconv.FormatInt(r.RequestsRemaining, 10)},
			[2]string{"x-ratelimit-reset-requests", reset})
	}
	if r.TokenLimit > 0 {
		e.Header = append(e.Header, [2]string{"x-ratelimit-limit-tokens", strconv.FormatInt(r.TokenLimit, 10)},
			[2]string{"x-ratelimit-remaining-tokens", strconv.FormatInt(r.TokensRemaining, 10)},
			[2]string{"x-ratelimit-reset-tokens", reset})
	}
	return e
}

// windowName is "minute", "day", or the window as a duration ("6h0m0s").
func windowName(w time.Duration) string {
	switch w {
	case time.Minute:
		return "minute"
	case 24 * time.Hour:
		return "day"
	}
	return w.String()
}

// Snapshot returns every tenant's budget state (no keys, no secrets).
func (a *Admitter) Snapshot() []TenantState {
	if a == nil {
		return nil
	}
	return a.budget.snapshot(a.now())
}

// Close releases the budget backend's connections (redis); the Admitter must not be
// used after.
func (a *Admitter) Close() error {
	if a == nil || a.redis == nil {
		return nil
	}
	return a.redis.close()
}

// Grant is one admitted request's reservation. Settle, Release or Abort it exactly
// once (later calls are no-ops); all are safe from any goroutine and nil-safe.
type Grant struct {
	a        *Admitter
	id       Identity
	labels   [2]string // tenant, class (Labeler.Labels)
	res      Reservation
	want     Want
	estimate int // output tokens reserved
	done     atomic.Bool
	// the VTC prompt charge Admit made for this grant's ticket (Release refunds it)
	vtcTenant string
	vtcPrompt float64
}

// Identity is who the grant is for.
func (g *Grant) Identity() Identity {
	if g == nil {
		return Identity{Tenant: Unattributed, Source: "none"}
	}
	return g.id
}

// CountsTokens reports whether the front should count the generated tokens of a
// streamed response (response.Tracker.CountContent, one JSON decode per SSE event):
// only for a tenant with a token budget. Without one the count would feed only the
// settled-token metrics, and a settlement without usage keeps the estimate.
func (g *Grant) CountsTokens() bool {
	return g != nil && g.a.budgeted(g.id.Tenant)
}

// Reserved is the token cost reserved.
func (g *Grant) Reserved() int64 {
	if g == nil {
		return 0
	}
	return g.res.Tokens
}

// Settle settles the grant from the response: the engine's usage when present
// (usage_source reported; cached tokens from usage when reported, else the router's
// prediction); else the generated tokens counted from the stream when counted ≥ 0
// (counted: content events, one per token as vLLM streams them, a lower bound with
// speculative decoding); else the reservation's estimate (estimated). The outcome is
// counted on kvroute_admission_requests_total. An aborted or failed request pays the
// same way: its prompt and what was streamed.
func (g *Grant) Settle(res response.Result, counted int) {
	if g == nil || !g.done.CompareAndSwap(false, true) {
		return
	}
	a := g.a
	uncached, cached, output, src := 0, 0, 0, ""
	switch u := res.Usage; {
	case u.Present:
		prompt := u.PromptTokens
		cached = min(max(g.want.CachedTokens, 0), max(prompt, 0))
		if u.CachedReported {
			cached = min(u.CachedTokens, max(prompt, 0))
		}
		uncached, output, src = prompt-cached, u.CompletionTokens, "reported"
	default:
		cached = min(max(g.want.CachedTokens, 0), max(g.want.PromptTokens, 0))
		uncached = g.want.PromptTokens - cached
		if counted >= 0 {
			output, src = counted, "counted"
		} else {
			output, src = g.estimate, "estimated"
		}
	}
	g.finish(a.cost(uncached, cached, output), uncached, cached, output, src, res.Outcome)
}

// Streamed is the counted argument of Settle for a response watched by tr: 0 when no
// response arrived (tr nil: nothing was generated for the client), the content events
// counted when tr counts them (response.Tracker.CountContent), else -1 (unknown: the
// estimate stands).
func Streamed(tr *response.Tracker) int {
	switch {
	case tr == nil:
		return 0
	case tr.Counting():
		return tr.ContentEvents()
	}
	return -1
}

// Release settles a grant whose request reached no worker (a connect failure retried
// elsewhere): it costs nothing — its reservation and the VTC prompt charge Admit made
// are given back — and is not counted as a request.
func (g *Grant) Release() {
	if g == nil || !g.done.CompareAndSwap(false, true) {
		return
	}
	g.a.settle(g.res, 0)
	g.a.queue.refund(g.vtcTenant, g.vtcPrompt)
	g.a.m.Settlements.WithLabelValues("released").Inc()
}

func (g *Grant) finish(actual int64, uncached, cached, output int, src string, o response.Outcome) {
	a := g.a
	a.settle(g.res, actual)
	if o == response.OutcomeOK && (src == "reported" || src == "counted") {
		a.hist.add(g.id.Tenant, g.want.Model, output)
	}
	a.m.Settlements.WithLabelValues(src).Inc()
	l := g.labels
	a.m.TokensSettled.WithLabelValues(l[0], l[1], "uncached").Add(float64(max(uncached, 0)))
	a.m.TokensSettled.WithLabelValues(l[0], l[1], "cached").Add(float64(max(cached, 0)))
	a.m.TokensSettled.WithLabelValues(l[0], l[1], "output").Add(float64(max(output, 0)))
	a.queue.charge(g.id.Tenant, a.cfg.Weights.Output*float64(max(output, 0))) // VTC: output served
	if o == "" {
		o = response.OutcomeAborted
	}
	a.m.Requests.WithLabelValues(l[0], l[1], string(o)).Inc()
}
