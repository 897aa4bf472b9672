package router

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/response"
)

// Each outcome is recorded on the ticket and decides what is learned: TTFT from every
// request that produced a first token, E2E (and the usage report) only from ok.
func TestOutcomeDecidesLearning(t *testing.T) {
	for _, c := range []struct {
		end        func(*Ticket) response.Outcome
		want       response.Outcome
		firstToken bool
	}{
		{func(tk *Ticket) response.Outcome {
			return tk.Complete(response.Result{Status: 200, Outcome: response.OutcomeOK, Usage: response.Usage{Present: true}}, time.Time{})
		}, response.OutcomeOK, true},
		{func(tk *Ticket) response.Outcome {
			return tk.Complete(response.Result{Status: 200, Outcome: response.OutcomeErrorEvent}, time.Time{})
		}, response.OutcomeErrorEvent, true},
		{func(tk *Ticket) response.Outcome {
			return tk.Complete(response.Result{Status: 200, Outcome: response.OutcomeTruncated}, time.Time{})
		}, response.OutcomeTruncated, false},
		{func(tk *Ticket) response.Outcome {
			tk.Done(400, response.Usage{}, time.Time{})
			return tk.Outcome()
		}, response.OutcomeClientError, false},
		{func(tk *Ticket) response.Outcome {
			tk.Done(503, response.Usage{}, time.Time{})
			return tk.Outcome()
		}, response.OutcomeUpstreamError, false},
		{func(tk *Ticket) response.Outcome { return tk.AbortWith(response.OutcomeUpstreamError) }, response.OutcomeUpstreamError, false},
		{func(tk *Ticket) response.Outcome { tk.Abort(); return tk.Outcome() }, response.OutcomeAborted, true},
	} {
		f := newFixture(t, 1, time.Minute)
		tk, err := f.r.Pick(context.Background(), chat, PickOptions{})
		if err != nil {
			t.Fatal(err)
		}
		f.clk.add(200 * time.Millisecond)
		if c.firstToken {
			tk.FirstToken(time.Time{})
		}
		f.clk.add(time.Second)
		if tk.Outcome() != "" {
			t.Fatal("an open ticket has no outcome")
		}
		if got := c.end(tk); got != c.want || tk.Outcome() != c.want {
			t.Fatalf("%s: ended with %q (recorded %q)", c.want, got, tk.Outcome())
		}
		ttfts, e2es := 0, 0
		for _, o := range f.pol.obs {
			if o.TTFT > 0 && o.E2E == 0 {
				ttfts++
			}
			if o.E2E > 0 {
				e2es++
			}
		}
		wantE2E := 0
		if c.want == response.OutcomeOK {
			wantE2E = 1
		}
		wantTTFT := 0
		if c.firstToken {
			wantTTFT = 1
		}
		if ttfts != wantTTFT || e2es != wantE2E {
			t.Errorf("%s: learner got %d TTFT and %d E2E reports, want %d and %d", c.want, ttfts, e2es, wantTTFT, wantE2E)
		}
		if n := testutil.CollectAndCount(f.ms.Router.E2ESeconds); n != wantE2E {
			t.Errorf("%s: E2E histogram series %d, want %d", c.want, n, wantE2E)
		}
		if got := testutil.ToFloat64(f.ms.Router.UsageReports.WithLabelValues("absent")); got != float64(wantE2E) {
			t.Errorf("%s: usage reports %v, want %d", c.want, got, wantE2E)
		}
		if f.r.InFlight() != 0 {
			t.Fatalf("%s: ticket not released", c.want)
		}
	}
}

// A ticket released by the sweep is expired; a front that completes it later is told
// so (and counts it as expired), and nothing is learned from the late completion.
func TestExpiredOutcomeWins(t *testing.T) {
	f := newFixture(t, 1, time.Minute)
	tk, err := f.r.Pick(context.Background(), chat, PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.clk.add(2 * time.Minute)
	if f.r.Sweep() != 1 {
		t.Fatal("sweep must release the old ticket")
	}
	if got := tk.Complete(response.Result{Status: 200, Outcome: response.OutcomeOK}, time.Time{}); got != response.OutcomeExpired {
		t.Fatalf("late completion: %q, want expired", got)
	}
	if got := tk.AbortWith(response.OutcomeAborted); got != response.OutcomeExpired {
		t.Fatalf("late abort: %q, want expired", got)
	}
	if len(f.pol.obs) != 0 || testutil.CollectAndCount(f.ms.Router.E2ESeconds) != 0 {
		t.Fatal("nothing is learned from an expired ticket")
	}
}
