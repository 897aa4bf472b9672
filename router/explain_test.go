package router

import (
	"context"
	"testing"

	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// dryRecorder picks the first candidate and records the DryRun flag it was given.
type dryRecorder struct{ dry []bool }

func (*dryRecorder) Name() string { return "dry" }
func (p *dryRecorder) Pick(in *scoring.Input, _ []scoring.Candidate) scoring.Decision {
	p.dry = append(p.dry, in.DryRun)
	return scoring.Decision{Index: 0}
}

// Explain changes no state a later pick sees: it hands the policy DryRun (round robin
// does not advance), books nothing, and Pick does not get DryRun.
func TestExplainAdvancesNoPolicyState(t *testing.T) {
	f := newFixture(t, 3, 0)
	rr, err := scoring.New(scoring.PolicyRoundRobin, scoring.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := New(Options{Registry: f.reg, Models: []Model{{Name: "m"}}, Policy: rr})
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		e, err := r.Explain(ctx, chat, PickOptions{})
		if err != nil || e.Candidates[e.Decision.Index].Worker.Name != "w0" || !e.Input.DryRun {
			t.Fatalf("explain %d: %+v %v, want w0 every time with DryRun", i, e, err)
		}
	}
	if r.InFlight() != 0 {
		t.Fatal("explain booked")
	}
	for i, want := range []string{"w0", "w1", "w2", "w0"} {
		tk, err := r.Pick(ctx, chat, PickOptions{})
		if err != nil || tk.Worker != want {
			t.Fatalf("pick %d after explains: %v %v, want %s (round robin untouched by explain)", i, tk, err, want)
		}
	}
	rec := &dryRecorder{}
	r2 := New(Options{Registry: f.reg, Models: []Model{{Name: "m"}}, Policy: rec})
	r2.Explain(ctx, chat, PickOptions{})
	r2.Pick(ctx, chat, PickOptions{})
	if len(rec.dry) != 2 || !rec.dry[0] || rec.dry[1] {
		t.Fatalf("DryRun seen by the policy %v, want [true false]", rec.dry)
	}
	// A worker removed while explain prepared is not shown; none left → the 503.
	r3 := New(Options{Registry: f.reg, Models: []Model{{Name: "m"}}, Tokenizer: removingTokenizer{f.reg, []*workers.Worker{}}})
	if e, err := r3.Explain(ctx, chat, PickOptions{}); err == nil {
		t.Fatalf("explain over removed workers: %+v, want the no-healthy-worker error", e)
	}
}
