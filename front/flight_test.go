package front

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/workers"
)

// settlements records what a Flight settles (the admission grant's side of the contract).
type settlements struct {
	res     []response.Result
	counted []int
}

func (s *settlements) Settle(res response.Result, counted int) {
	s.res = append(s.res, res)
	s.counted = append(s.counted, counted)
}

func pick(t *testing.T) (*router.Router, *router.Ticket) {
	t.Helper()
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "w", Address: "127.0.0.1:1", Models: []string{"m"}}})
	r := router.New(router.Options{Registry: reg, Models: []router.Model{{Name: "m"}}})
	tk, err := r.Pick(context.Background(), &request.Request{API: request.APICompletions, Model: "m", PromptTokenIDs: [][]uint32{{1, 2, 3}}}, router.PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r, tk
}

// Complete ends the ticket (in-flight released), settles once with the outcome the
// ticket decided, and a later Abort changes nothing.
func TestFlightCompleteThenAbort(t *testing.T) {
	r, tk := pick(t)
	s := &settlements{}
	aborts := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aborts"}, []string{"reason"})
	f := &Flight{Ticket: tk, Grant: s, Aborts: aborts}
	if f.Ended() || f.Outcome() != "" {
		t.Fatal("a new flight has ended")
	}
	o := f.Complete(response.Result{Status: 200, Outcome: response.OutcomeOK, Usage: response.Usage{Present: true, PromptTokens: 3, CompletionTokens: 2}}, 2)
	if o != response.OutcomeOK || !f.Ended() || f.Outcome() != o {
		t.Fatalf("Complete: outcome %q, ended %v", o, f.Ended())
	}
	if r.InFlight() != 0 {
		t.Fatalf("in-flight %d after Complete", r.InFlight())
	}
	if got := f.Abort("client_gone", response.OutcomeAborted, 5); got != response.OutcomeOK {
		t.Fatalf("Abort after Complete returned %q, want the recorded ok", got)
	}
	if len(s.res) != 1 || s.res[0].Outcome != response.OutcomeOK || s.counted[0] != 2 {
		t.Fatalf("settlements %+v %v, want one ok with 2 counted", s.res, s.counted)
	}
	if n := testutil.ToFloat64(aborts.WithLabelValues("client_gone")); n != 0 {
		t.Fatalf("an abort after completion was counted (%v)", n)
	}
}

// Abort ends the ticket with its outcome, settles once, counts the reason once; a later
// Complete changes nothing.
func TestFlightAbortThenComplete(t *testing.T) {
	r, tk := pick(t)
	s := &settlements{}
	aborts := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aborts"}, []string{"reason"})
	f := &Flight{Ticket: tk, Grant: s, Aborts: aborts}
	if o := f.Abort("upstream_error", response.OutcomeUpstreamError, -1); o != response.OutcomeUpstreamError {
		t.Fatalf("Abort: %q", o)
	}
	f.Abort("client_gone", response.OutcomeAborted, -1)
	if o := f.Complete(response.Result{Status: 200, Outcome: response.OutcomeOK}, 0); o != response.OutcomeUpstreamError {
		t.Fatalf("Complete after Abort returned %q", o)
	}
	if r.InFlight() != 0 {
		t.Fatalf("in-flight %d after Abort", r.InFlight())
	}
	if len(s.res) != 1 || s.res[0].Outcome != response.OutcomeUpstreamError || s.counted[0] != -1 {
		t.Fatalf("settlements %+v %v", s.res, s.counted)
	}
	if a, b := testutil.ToFloat64(aborts.WithLabelValues("upstream_error")), testutil.ToFloat64(aborts.WithLabelValues("client_gone")); a != 1 || b != 0 {
		t.Fatalf("aborts counted upstream_error=%v client_gone=%v, want 1 and 0", a, b)
	}
}

// Without a grant, a span or a counter a Flight still ends its ticket.
func TestFlightWithoutGrant(t *testing.T) {
	r, tk := pick(t)
	f := &Flight{Ticket: tk}
	f.Abort("client_gone", response.OutcomeAborted, 0)
	if r.InFlight() != 0 || f.Outcome() != response.OutcomeAborted {
		t.Fatalf("in-flight %d, outcome %q", r.InFlight(), f.Outcome())
	}
}
