package admission

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// sloSetup is a router with kvroute's own TTFT predictor (prior coefficients: 5,000
// prefill tokens/s, 20 ms overhead, 1,024 tokens per foreign request) over workers a
// and b, and an Admitter with classes.
func sloSetup(t *testing.T, classes []config.Class) (*Admitter, *router.Router, *workers.Registry, *metrics.Set) {
	t.Helper()
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "a", Address: "10.0.0.1:8000", Models: []string{"m"}}, {Name: "b", Address: "10.0.0.2:8000", Models: []string{"m"}}})
	ms := metrics.NewUnregistered()
	pol, err := scoring.New(scoring.PolicyKVRouteStatic, scoring.Options{Rand: rand.New(rand.NewPCG(1, 2)), Metrics: ms.Scoring})
	if err != nil {
		t.Fatal(err)
	}
	rt := router.New(router.Options{Registry: reg, Models: []router.Model{{Name: "m"}}, Metrics: ms, Policy: pol})
	c := config.Default().Admission
	c.Classes = classes
	a, err := New(Options{Config: c, Metrics: ms})
	if err != nil {
		t.Fatal(err)
	}
	return a, rt, reg, ms
}

func sloReq() *request.Request {
	ids := make([]uint32, 2000)
	for i := range ids {
		ids[i] = uint32(i + 1)
	}
	return &request.Request{API: request.APICompletions, Model: "m", PromptTokenIDs: [][]uint32{ids}}
}

var refuseClass = config.Class{Name: "interactive", TTFTObjective: 2 * time.Second, OnSLOMiss: config.SLOMissRefuse,
	Match: config.ClassMatch{Tenants: []string{"i"}}}

// Idle workers meet a 2 s objective (2,000 tokens at 5,000 tokens/s ≈ 0.42 s): admitted.
// With 40 foreign requests waiting on each worker (≈ 40 × 1,024 / 5,000 ≈ 8.2 s of queue)
// no worker is predicted within it: refused at once with 429, the reason and class
// headers, Retry-After the predicted excess (≈ 6.6 s, whole seconds up), counted per
// tenant and class; a class without on_slo_miss is admitted to the best worker as before.
func TestSLORefusalAtArrival(t *testing.T) {
	a, rt, reg, ms := sloSetup(t, []config.Class{refuseClass, {Name: "batch", TTFTObjective: 2 * time.Second}})
	ctx := context.Background()
	p, err := a.Pick(ctx, rt, sloReq(), router.PickOptions{}, ClassInput{Tenant: "i"})
	if err != nil || p.Ticket == nil {
		t.Fatalf("idle fleet: %v (a request predicted within its objective is never refused)", err)
	}
	p.Ticket.Abort()

	now := time.Now()
	for _, w := range []string{"a", "b"} {
		reg.SetLoad(w, workers.Load{Waiting: 40, Running: 8, ScrapedAt: now})
	}
	_, err = a.Pick(ctx, rt, sloReq(), router.PickOptions{}, ClassInput{Tenant: "i"})
	var re *router.Error
	if !errors.As(err, &re) || re.Status != http.StatusTooManyRequests {
		t.Fatalf("overloaded fleet: want a 429 *router.Error, got %v", err)
	}
	if header(re, RejectedReasonHeader) != router.ReasonSLOMiss || header(re, "x-kvroute-class") != "interactive" {
		t.Fatalf("headers %v", re.Header)
	}
	if re.RetryAfter < 5*time.Second || re.RetryAfter > 9*time.Second {
		t.Fatalf("Retry-After %s: want the predicted drain past the objective, ≈ 6–7 s", re.RetryAfter)
	}
	if got := testutil.ToFloat64(ms.Admission.Refused.WithLabelValues("i", "interactive", router.ReasonSLOMiss)); got != 1 {
		t.Fatalf("kvroute_admission_refused_total{reason=slo_miss} = %v, want 1", got)
	}
	// the autoscaling gauges: the best prediction of the refused pick (≈ 8.6 s: 8.2 s of
	// queue + 0.42 s of prefill), the margin (1: no feedback yet), no pressure
	if got := testutil.ToFloat64(ms.Router.BestTTFT.WithLabelValues("m")); got < 7 || got > 10 {
		t.Fatalf("kvroute_router_best_predicted_ttft_seconds = %v, want ≈ 8.6", got)
	}
	if m, p := testutil.ToFloat64(ms.Router.SLOMargin), testutil.ToFloat64(ms.Router.SLOPressure.WithLabelValues("interactive")); m != 1 || p != 1 {
		t.Fatalf("slo_margin %v, slo_pressure %v: want 1 and 1 before any feedback", m, p)
	}
	if c := testutil.ToFloat64(ms.Router.SLOCorrection.WithLabelValues("interactive")); c != 1 {
		t.Fatalf("slo_correction %v: want 1 before any admitted miss", c)
	}
	p, err = a.Pick(ctx, rt, sloReq(), router.PickOptions{}, ClassInput{Tenant: "other"})
	if err != nil || p.Ticket == nil || p.Class.Name != "batch" {
		t.Fatalf("on_slo_miss unset (admit): %+v %v", p, err)
	}
	p.Ticket.Abort()
}

// The client's x-slo-ttft-ms tightens the class objective (the smaller wins), never
// loosens it: a request asking for 60 s in a 2 s refuse class is still refused.
func TestSLORefusalUsesTheTighterObjective(t *testing.T) {
	a, rt, reg, _ := sloSetup(t, []config.Class{refuseClass})
	now := time.Now()
	for _, w := range []string{"a", "b"} {
		reg.SetLoad(w, workers.Load{Waiting: 40, Running: 8, ScrapedAt: now})
	}
	_, err := a.Pick(context.Background(), rt, sloReq(), router.PickOptions{SLO: time.Minute}, ClassInput{Tenant: "i"})
	var re *router.Error
	if !errors.As(err, &re) || header(re, RejectedReasonHeader) != router.ReasonSLOMiss {
		t.Fatalf("want slo_miss, got %v", err)
	}
	for _, w := range []string{"a", "b"} {
		reg.SetLoad(w, workers.Load{ScrapedAt: now})
	}
	_, err = a.Pick(context.Background(), rt, sloReq(), router.PickOptions{SLO: time.Millisecond}, ClassInput{Tenant: "i"})
	if !errors.As(err, &re) || header(re, RejectedReasonHeader) != router.ReasonSLOMiss {
		t.Fatalf("a 1 ms client objective no idle worker meets: want slo_miss, got %v", err)
	}
}

func TestPolicyOfAClass(t *testing.T) {
	c := config.Class{Name: "x", Priority: 3, TTFTObjective: 3 * time.Second, QueueLimit: 5, MaxQueueTime: time.Second, OnSLOMiss: config.SLOMissRefuse, SLOAttainment: 0.95}
	if got := Policy(&c, 0, true); got != (router.ClassPolicy{SLO: 3 * time.Second, Wait: true, RefuseOnSLOMiss: true, Class: "x", Priority: 3, Attainment: 0.95}) {
		t.Fatalf("%+v", got)
	}
	if got := Policy(&c, time.Second, false); got != (router.ClassPolicy{SLO: time.Second, Wait: false, RefuseOnSLOMiss: true, Class: "x", Priority: 3, Attainment: 0.95}) {
		t.Fatalf("client objective, no queue: %+v", got)
	}
	d := config.Class{Name: "default"}
	if got := Policy(&d, 0, true); got != (router.ClassPolicy{Class: "default"}) {
		t.Fatalf("the default class decides nothing: %+v", got)
	}
}
