package router

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// The Gateway API Inference Extension endpoint picker protocol
// (gateway-api-inference-extension docs/proposals/004-endpoint-picker-protocol), as the
// router core implements it. The ext_proc side (metadata in, header and metadata out) is
// tested through the Envoy stand-in in e2e/gie_test.go.

// "Endpoint Subset": the EPP MUST only select endpoints from the list.
func TestPickOnlyFromSubsetHint(t *testing.T) {
	f := newFixture(t, 4, time.Minute)
	subset := []string{"10.0.0.2:8000", "10.0.0.4:8000", "192.0.2.9:8000"} // the last is no worker
	seen := map[string]int{}
	for i := 0; i < 40; i++ {
		tk, err := f.r.Pick(context.Background(), chat, PickOptions{Subset: subset, SubsetHint: true})
		if err != nil {
			t.Fatal(err)
		}
		seen[tk.Address]++
	}
	if len(seen) != 2 || seen["10.0.0.2:8000"] == 0 || seen["10.0.0.4:8000"] == 0 {
		t.Fatalf("picks outside the subset or not spread over it: %v", seen)
	}
}

// "If none of the endpoints in the list is eligible or the list is empty, then the EPP
// MUST return an ImmediateResponse with 503."
func TestSubsetHintEmptyOrIneligibleIs503(t *testing.T) {
	f := newFixture(t, 3, time.Minute)
	f.reg.SetHealthy("w1", false)
	for name, subset := range map[string][]string{
		"empty":     {},
		"unknown":   {"192.0.2.1:8000"},
		"unhealthy": {"10.0.0.2:8000"},
		"nil, hint": nil,
	} {
		_, err := f.r.Pick(context.Background(), chat, PickOptions{Subset: subset, SubsetHint: true})
		var re *Error
		if !errors.As(err, &re) || re.Status != http.StatusServiceUnavailable {
			t.Fatalf("%s subset: got %v, want a 503", name, err)
		}
	}
	if got := testutil.ToFloat64(f.ms.Router.Errors.WithLabelValues("subset")); got != 4 {
		t.Fatalf("errors_total{reason=subset} = %v, want 4", got)
	}
	if f.r.InFlight() != 0 {
		t.Fatalf("a refused pick booked something: %d in flight", f.r.InFlight())
	}
	// Without the hint every healthy worker stays eligible.
	if _, err := f.r.Pick(context.Background(), chat, PickOptions{}); err != nil {
		t.Fatal(err)
	}
}

// ranked predicts a fixed TTFT per worker name and picks the lowest.
type ranked map[string]time.Duration

func (ranked) Name() string { return "ranked" }
func (p ranked) Pick(_ *scoring.Input, cands []scoring.Candidate) scoring.Decision {
	d := scoring.Decision{Index: 0, Reason: scoring.ReasonBest, Predictions: make([]scoring.Prediction, len(cands))}
	for i, c := range cands {
		d.Predictions[i].TTFT = p[c.Worker.Name]
		if d.Predictions[i].TTFT < d.Predictions[d.Index].TTFT {
			d.Index = i
		}
	}
	return d
}

// "Destination Endpoint": one or more endpoints, the first used, later ones for
// retries. kvroute lists the pick, then the next best predictions in order.
func TestFallbacksInPredictionOrder(t *testing.T) {
	f := newFixture(t, 4, time.Minute)
	f.r = New(Options{Registry: f.reg, Models: []Model{{Name: "m"}}, Metrics: f.ms, Now: f.clk.now,
		Policy: ranked{"w0": 3 * time.Second, "w1": time.Second, "w2": 4 * time.Second, "w3": 2 * time.Second}})
	tk, err := f.r.Pick(context.Background(), chat, PickOptions{Fallbacks: 2})
	if err != nil {
		t.Fatal(err)
	}
	if tk.Address != "10.0.0.2:8000" || !slices.Equal(tk.Fallbacks, []string{"10.0.0.4:8000", "10.0.0.1:8000"}) {
		t.Fatalf("pick %s, fallbacks %v; want 10.0.0.2:8000 then [10.0.0.4:8000 10.0.0.1:8000]", tk.Address, tk.Fallbacks)
	}
	tk.Abort()
	// More fallbacks asked than workers: all others, none twice, never the pick.
	tk, _ = f.r.Pick(context.Background(), chat, PickOptions{Fallbacks: 10})
	if len(tk.Fallbacks) != 3 || slices.Contains(tk.Fallbacks, tk.Address) {
		t.Fatalf("fallbacks %v for pick %s", tk.Fallbacks, tk.Address)
	}
	tk.Abort()
	// Not asked: none.
	tk, _ = f.r.Pick(context.Background(), chat, PickOptions{})
	if tk.Fallbacks != nil {
		t.Fatalf("fallbacks %v without asking", tk.Fallbacks)
	}
}

// "Destination Endpoint Served": the data plane reports the endpoint that served; the
// booking follows it, before and after the first token, and is released from there.
func TestServedMovesTheBooking(t *testing.T) {
	f := newFixture(t, 3, time.Minute)
	tk, err := f.r.Pick(context.Background(), chat, PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	picked := tk.Worker
	var other string
	var otherAddr string
	for _, w := range f.reg.All() {
		if w.Name != picked {
			other, otherAddr = w.Name, w.Address
			break
		}
	}
	if tk.Served(tk.Address) {
		t.Fatal("the picked address itself moved the booking")
	}
	if tk.Served("192.0.2.1:8000") {
		t.Fatal("an address no worker has moved the booking")
	}
	if got := testutil.ToFloat64(f.ms.Router.ServedUnknown); got != 1 {
		t.Fatalf("served_unknown_total = %v, want 1", got)
	}
	if !tk.Served(otherAddr) {
		t.Fatal("a served report from another worker did not move the booking")
	}
	if b := f.booked(picked); b.Requests != 0 || b.Prefilling != 0 {
		t.Fatalf("picked worker still booked %+v", b)
	}
	if b := f.booked(other); b.Requests != 1 || b.Prefilling != 1 {
		t.Fatalf("serving worker booked %+v, want the request prefilling", b)
	}
	if got := testutil.ToFloat64(f.ms.Router.ServedMoves.WithLabelValues(other)); got != 1 {
		t.Fatalf("served_moves_total{worker=%s} = %v", other, got)
	}
	tk.FirstToken(time.Time{})
	if b := f.booked(other); b.Decoding != 1 || b.Prefilling != 0 {
		t.Fatalf("after the first token the serving worker has %+v", b)
	}
	tk.Done(200, response.Usage{}, time.Time{})
	if b := f.booked(other); b != (scoring.Booked{}) {
		t.Fatalf("after Done the serving worker still has %+v", b)
	}
	if tk.Served(tk.Address) {
		t.Fatal("an ended ticket moved")
	}
	// A moved ticket's prediction was for another worker: nothing is learned from it.
	if n := len(f.pol.obs); n != 0 {
		t.Fatalf("learned %d observations from a moved ticket", n)
	}
}

// Removing the worker that now holds a moved booking releases it.
func TestServedBookingReleasedWithItsWorker(t *testing.T) {
	f := newFixture(t, 2, time.Minute)
	tk, _ := f.r.Pick(context.Background(), chat, PickOptions{})
	var keep, keepAddr string
	for _, w := range f.reg.All() {
		if w.Name != tk.Worker {
			keep, keepAddr = w.Name, w.Address
		}
	}
	tk.Served(keepAddr)
	ws := f.reg.All()
	f.reg.Set(slices.DeleteFunc(ws, func(w *workers.Worker) bool { return w.Name == keep }))
	if f.r.InFlight() != 0 {
		t.Fatalf("%d tickets in flight after the serving worker left", f.r.InFlight())
	}
}
