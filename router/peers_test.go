package router

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"

	"github.com/kvroute/kvroute/kvindex"
)

// alternatePolicy picks candidate 0, then 1, then 0, ...
type alternatePolicy struct{ n atomic.Int64 }

func (*alternatePolicy) Name() string { return "alternate" }
func (p *alternatePolicy) Pick(_ *scoring.Input, c []scoring.Candidate) scoring.Decision {
	return scoring.Decision{Index: int(p.n.Add(1)-1) % len(c), Reason: "alternate"}
}

// The same new prefix prefilling on two workers at once is reported for both: the
// keys of LocalBookings are deduplicated per worker (a set shared across workers
// reported it only for the first, and peers then routed to that one alone).
func TestLocalBookingsReportsKeysPerWorker(t *testing.T) {
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "w0", Address: "10.0.0.1:8000", Models: []string{"m"}},
		{Name: "w1", Address: "10.0.0.2:8000", Models: []string{"m"}}})
	ix := kvindex.New(kvindex.Options{SpeculativeTTL: time.Hour})
	r := New(Options{Registry: reg, Index: ix, Policy: &alternatePolicy{}, Metrics: metrics.NewUnregistered(),
		Models: []Model{{Name: "m", BlockSize: 16}}})
	ctx := context.Background()
	var tks []*Ticket
	for range 2 {
		tk, err := r.Pick(ctx, promptOf(160, 7), PickOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer tk.Done(200, response.Usage{}, time.Time{})
		tks = append(tks, tk)
	}
	if tks[0].Worker == tks[1].Worker {
		t.Fatalf("both on %s, want one per worker", tks[0].Worker)
	}
	got := map[string]int{}
	for _, wb := range r.LocalBookings(100) {
		got[wb.Worker] = len(wb.Keys)
		if wb.Booked.Prefilling != 1 || wb.OldestPrefill.IsZero() {
			t.Errorf("%s: booked %+v oldest %v, want 1 prefilling with its start", wb.Worker, wb.Booked, wb.OldestPrefill)
		}
	}
	// 160 tokens = 10 blocks; the last token is recomputed, so 9 or 10 keys are booked.
	if got["w0"] == 0 || got["w0"] != got["w1"] {
		t.Fatalf("keys per worker %v, want the same prefix reported on both", got)
	}
	if w := r.LocalBookings(3); len(w) != 2 || len(w[0].Keys) != 3 || len(w[1].Keys) != 3 {
		t.Fatalf("maxKeys 3: %+v, want 3 keys on each worker", w)
	}
}
