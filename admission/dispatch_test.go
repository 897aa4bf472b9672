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
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

func TestAtDispatchLeavesWhatIsLeftOfTheObjective(t *testing.T) {
	p := router.ClassPolicy{SLO: 8 * time.Second, RefuseOnSLOMiss: true, Class: "x"}
	if got := AtDispatch(p, 3*time.Second); got.SLO != 5*time.Second || !got.RefuseOnSLOMiss || got.Class != "x" {
		t.Fatalf("3 s waited of 8: %+v, want 5 s left", got)
	}
	if got := AtDispatch(p, 9*time.Second); got.SLO != time.Nanosecond {
		t.Fatalf("past the objective: %+v, want 1 ns left", got)
	}
	if got := AtDispatch(p, 0); got != p {
		t.Fatalf("not queued: %+v", got)
	}
	if got := AtDispatch(router.ClassPolicy{Class: "y"}, time.Second); got.SLO != 0 {
		t.Fatalf("no objective stays none: %+v", got)
	}
}

// dispatchSetup: kvroute's predictor (prior: 20 ms overhead) on one worker that one
// booked request saturates (max_num_seqs 1), and a class that queues and refuses.
func dispatchSetup(t *testing.T, objective time.Duration) (*Admitter, *router.Router, *metrics.Set) {
	t.Helper()
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "a", Address: "10.0.0.1:8000", Models: []string{"m"}}})
	ms := metrics.NewUnregistered()
	pol, err := scoring.New(scoring.PolicyKVRouteStatic, scoring.Options{Rand: rand.New(rand.NewPCG(1, 2)), Metrics: ms.Scoring})
	if err != nil {
		t.Fatal(err)
	}
	rt := router.New(router.Options{Registry: reg, Models: []router.Model{{Name: "m"}}, Metrics: ms, Policy: pol,
		Saturation: router.Saturation{MaxNumSeqs: 1}})
	c := config.Default().Admission
	c.Classes = []config.Class{{Name: "interactive", TTFTObjective: objective, OnSLOMiss: config.SLOMissRefuse,
		QueueLimit: 10, MaxQueueTime: time.Hour}}
	a, err := New(Options{Config: c, Metrics: ms})
	if err != nil {
		t.Fatal(err)
	}
	rt.OnCapacity(a.Wake)
	return a, rt, ms
}

// A request that waited in the queue past its class objective is refused when capacity
// frees (429 slo_miss: what is left of 300 ms after ≥ 400 ms queued is nothing, and
// no worker starts it in that), not sent to miss it; one whose objective is far from
// spent is dispatched as before. The sleep only lengthens the wait on a slow machine.
func TestQueuedRequestIsJudgedAgainAtDispatch(t *testing.T) {
	for _, tc := range []struct {
		objective, wait time.Duration
		refused         bool
	}{{300 * time.Millisecond, 400 * time.Millisecond, true}, {time.Hour, 0, false}} {
		a, rt, ms := dispatchSetup(t, tc.objective)
		ctx := context.Background()
		first, err := a.Pick(ctx, rt, qreq(), router.PickOptions{}, ClassInput{Tenant: "x"})
		if err != nil {
			t.Fatalf("idle worker: %v", err)
		}
		ch := goPick(ctx, a, rt, "x")
		waitQueued(t, a, "interactive", 1)
		time.Sleep(tc.wait)
		first.Ticket.Done(200, response.Usage{}, time.Time{})
		r := <-ch
		var re *router.Error
		if !tc.refused {
			if r.err != nil || r.p.Ticket == nil || r.p.Waited <= 0 {
				t.Fatalf("objective %v: %+v %v, want dispatched after waiting", tc.objective, r.p, r.err)
			}
			r.p.Ticket.Abort()
			continue
		}
		if !errors.As(r.err, &re) || re.Status != http.StatusTooManyRequests || header(re, RejectedReasonHeader) != router.ReasonSLOMiss {
			t.Fatalf("objective %v spent in the queue: %v, want 429 slo_miss", tc.objective, r.err)
		}
		if got := testutil.ToFloat64(ms.Admission.Refused.WithLabelValues("x", "interactive", router.ReasonSLOMiss)); got != 1 {
			t.Fatalf("refused_total{slo_miss} = %v", got)
		}
	}
}
