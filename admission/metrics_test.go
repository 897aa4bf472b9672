package admission

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/workers"
)

// settledOutcomes are the outcomes a settled grant can have (rejected is a refusal's).
var settledOutcomes = []response.Outcome{response.OutcomeOK, response.OutcomeClientError, response.OutcomeUpstreamError,
	response.OutcomeErrorEvent, response.OutcomeTruncated, response.OutcomeAborted, response.OutcomeExpired}

// exerciseLimits let exercise reach every refusal reason: one concurrent request,
// len(settledOutcomes)+1 requests per minute, 10,000 tokens.
func exerciseLimits() config.Limits {
	return config.Limits{MaxConcurrent: 1, RequestsPerMinute: int64(len(settledOutcomes)) + 1, TokensPerMinute: 10000}
}

func testRouter(t testing.TB) *router.Router {
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "w", Address: "10.0.0.1:8000", Models: []string{"m"}}})
	return router.New(router.Options{Registry: reg, Models: []router.Model{{Name: "m"}}})
}

// exercise drives every per-tenant series tenant can reach through a (whose limits are
// exerciseLimits): a picked request's first token (TTFT) and every settled outcome,
// and the refusals concurrency, tokens and requests, each once.
func exercise(t testing.TB, a *Admitter, r *router.Router, tenant string) {
	t.Helper()
	id := Identity{Tenant: tenant}
	tk, err := r.Pick(context.Background(), &request.Request{API: request.APIChat, Model: "m"}, router.PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w := WantOf(tk, 16)
	w.PromptTokens, w.CachedTokens = 10, 4
	first, err := a.Reserve(id, w)
	if err != nil {
		t.Fatal(err)
	}
	tk.FirstToken(tk.Start.Add(1500 * 1e6)) // 1.5 s
	if _, err := a.Reserve(id, Want{PromptTokens: 1}); err == nil {
		t.Fatal("concurrency not refused")
	}
	tk.Done(200, response.Usage{}, tk.Start.Add(2e9))
	first.Settle(response.Result{Outcome: settledOutcomes[0]}, 3)
	for _, o := range settledOutcomes[1:] {
		g, err := a.Reserve(id, Want{PromptTokens: 10, MaxTokens: 16})
		if err != nil {
			t.Fatal(err)
		}
		g.Settle(response.Result{Outcome: o}, 2)
	}
	if _, err := a.Reserve(id, Want{PromptTokens: 20000}); err == nil {
		t.Fatal("tokens not refused")
	}
	g, err := a.Reserve(id, Want{PromptTokens: 1, MaxTokens: 1})
	if err != nil {
		t.Fatal(err)
	}
	g.Settle(response.Result{Outcome: response.OutcomeOK}, 1)
	if _, err := a.Reserve(id, Want{PromptTokens: 1}); err == nil {
		t.Fatal("requests not refused")
	}
}

// seriesByTenant counts the exposed time series of the admission families per tenant
// label value: one per counter child; a histogram child is its buckets, +Inf, _sum and
// _count, as Prometheus scrapes them.
func seriesByTenant(t testing.TB, reg *prometheus.Registry) map[string]int {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			tenant, ok := labelValue(m, "tenant")
			if !ok {
				continue
			}
			n := 1
			if h := m.GetHistogram(); h != nil {
				n = len(h.GetBucket()) + 3
			}
			out[tenant] += n
		}
	}
	return out
}

func labelValue(m *dto.Metric, name string) (string, bool) {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue(), true
		}
	}
	return "", false
}

// docSeriesPerTenant is the series count per tenant docs/metrics.md states.
func docSeriesPerTenant(t *testing.T) int {
	t.Helper()
	raw, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`at most \*\*(\d+)\*\* series per tenant`).FindSubmatch(raw)
	if m == nil {
		t.Fatal(`docs/metrics.md does not state "at most **N** series per tenant"`)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// The series count per tenant (label value) and class that docs/metrics.md states is
// the one measured: unattributed, the one tenant that can also be refused as
// unauthenticated, driven through every outcome, reason, kind and a TTFT.
func TestSeriesPerTenantDocumented(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := config.Default().Admission
	c.Default = exerciseLimits()
	c.RequireTenant = true
	a, err := New(Options{Config: c, Metrics: metrics.New(reg), Now: fixed})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Identify(Input{}); err == nil {
		t.Fatal("require_tenant: want 401")
	}
	exercise(t, a, testRouter(t), Unattributed)
	// The TTFT is the router's observation of the picked ticket: 1.5 s, once.
	fams, _ := reg.Gather()
	for _, f := range fams {
		if f.GetName() == "kvroute_admission_time_to_first_token_seconds" {
			h := f.GetMetric()[0].GetHistogram()
			if h.GetSampleCount() != 1 || h.GetSampleSum() != 1.5 {
				t.Fatalf("tenant TTFT: %d samples, sum %v; want 1 of 1.5 s", h.GetSampleCount(), h.GetSampleSum())
			}
		}
	}
	got := seriesByTenant(t, reg)[Unattributed]
	if want := docSeriesPerTenant(t); got != want {
		t.Fatalf("measured %d series for one tenant, docs/metrics.md says %d", got, want)
	}
}

// Flooding 10,000 distinct tenants, each through every per-tenant series, keeps the
// tenant label within the allowlist + cap + {other, unattributed}: exactly that many
// label values, each with at most the documented series, whatever the flood.
func TestTenantLabelCardinalityBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	ms := metrics.New(reg)
	c := config.Default().Admission
	c.MetricsTenants = []string{"vip"}
	c.MetricsMaxTenants = 20
	c.Default = exerciseLimits()
	a, err := New(Options{Config: c, Metrics: ms, Now: fixed})
	if err != nil {
		t.Fatal(err)
	}
	r := testRouter(t)
	for i := range 10000 {
		exercise(t, a, r, "t"+strconv.Itoa(i))
	}
	exercise(t, a, r, "vip")
	exercise(t, a, r, Unattributed)
	per := seriesByTenant(t, reg)
	if len(per) != 20+1+1+1 { // 20 first seen, vip, other, unattributed
		t.Fatalf("%d tenant label values, want 23: %v", len(per), per)
	}
	if per["t19"] == 0 || per["t20"] != 0 || per[Other] == 0 || per["vip"] == 0 {
		t.Fatalf("first seen / cap / other / allowlist wrong: %v", per)
	}
	limit, total := docSeriesPerTenant(t), 0
	for tenant, n := range per {
		if n > limit {
			t.Errorf("tenant %q has %d series, the documented bound is %d", tenant, n, limit)
		}
		total += n
	}
	if total > 23*limit {
		t.Fatalf("%d series for 10,002 tenants, bound %d", total, 23*limit)
	}
	t.Logf("10,002 tenants → %d label values, %d series", len(per), total)
	// The budget map itself stays bounded too: idle tenants of ended windows are pruned.
	if len(a.budget.(*local).tenants) > 10002 {
		t.Fatal("budget map grew past the tenants seen")
	}
}
