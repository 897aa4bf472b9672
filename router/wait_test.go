package router

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// slowPredictor predicts 10 s of TTFT on every worker, idle or not, and picks the one
// with the least booked prefill: the predictions of the overload defect (every busy
// worker over the objective while its engine would still schedule more).
type slowPredictor struct{}

func (slowPredictor) Name() string { return "slow" }
func (slowPredictor) Pick(in *scoring.Input, cands []scoring.Candidate) scoring.Decision {
	preds := make([]scoring.Prediction, len(cands))
	best := 0
	for i, c := range cands {
		preds[i].TTFT = 10 * time.Second
		if c.Booked.PrefillTokens < cands[best].Booked.PrefillTokens {
			best = i
		}
	}
	return scoring.Decision{Index: best, Reason: scoring.ReasonBest, Predictions: preds}
}

func waitRouter(sat Saturation) *Router {
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "a", Address: "10.0.0.1:8000", Models: []string{"m"}},
		{Name: "b", Address: "10.0.0.2:8000", Models: []string{"m"}}})
	return New(Options{Registry: reg, Models: []Model{{Name: "m"}}, Policy: slowPredictor{}, Saturation: sat})
}

func tokReq(n int) *request.Request {
	toks := make([]uint32, n)
	for i := range toks {
		toks[i] = uint32(i + 1)
	}
	return &request.Request{API: request.APICompletions, Model: "m", PromptTokenIDs: [][]uint32{toks}}
}

// The overload defect: with every worker busy and every prediction over the objective,
// the gate used to hold the request although the engines had room in their next step.
// Now it holds only once the worker the policy picks has its booked step full
// (prefill + decodes ≥ max_num_batched_tokens), and a first token (prefill done)
// makes room again.
func TestWaitOnlyWhenSaturatedByTokens(t *testing.T) {
	r := waitRouter(Saturation{BatchTokens: 100, MaxNumSeqs: 1000})
	ctx := context.Background()
	po := PickOptions{SLO: time.Second, Wait: true}
	var ts []*Ticket
	// 40-token prompts: a and b take two each (80 < 100 booked), all busy, all
	// predicted at 10 s > 1 s: none may wait
	for i := 0; i < 4; i++ {
		tk, err := r.Pick(ctx, tokReq(40), po)
		if err != nil {
			t.Fatalf("pick %d under saturation: %v", i, err)
		}
		ts = append(ts, tk)
	}
	// a third on each fills both steps (120 ≥ 100)
	for i := 0; i < 2; i++ {
		tk, err := r.Pick(ctx, tokReq(40), po)
		if err != nil {
			t.Fatalf("pick %d reaching saturation: %v", 4+i, err)
		}
		ts = append(ts, tk)
	}
	if _, err := r.Pick(ctx, tokReq(40), po); !errors.Is(err, ErrWait) {
		t.Fatalf("both saturated: %v, want ErrWait", err)
	}
	// a's first ticket gets its first token: its 40 prefill tokens leave a's step and
	// one decode token joins it: 120 − 40 + 1 = 81 < 100, room again, on a only
	var onA *Ticket
	for _, tk := range ts {
		if tk.Worker == "a" {
			onA = tk
			break
		}
	}
	onA.FirstToken(time.Time{})
	r.mu.Lock()
	c := scoring.Candidate{Worker: &workers.Worker{Name: "a"}}
	r.bookedLocked(&c, time.Time{}, 16)
	after := c.Booked
	r.mu.Unlock()
	if after.PrefillTokens != 80 || after.Decoding != 1 {
		t.Fatalf("booked on a after a first token: %+v, want 80 prefill tokens, 1 decoding", after)
	}
	tk, err := r.Pick(ctx, tokReq(40), po)
	if err != nil || tk.Worker != "a" {
		t.Fatalf("after a first token on a: %v %v, want a", tk, err)
	}
	if _, err := r.Pick(ctx, tokReq(40), po); !errors.Is(err, ErrWait) {
		t.Fatalf("a full again (120 + 1): %v, want ErrWait", err)
	}
	// without Wait (a class with no queue) the request goes through all the same
	if _, err := r.Pick(ctx, tokReq(40), PickOptions{SLO: time.Second}); err != nil {
		t.Fatal(err)
	}
}

// max_num_seqs: one booked request per worker saturates (MaxNumSeqs 1) whatever its
// size; a finished ticket frees its worker.
func TestWaitOnlyWhenSaturatedBySeqs(t *testing.T) {
	r := waitRouter(Saturation{MaxNumSeqs: 1})
	ctx := context.Background()
	po := PickOptions{SLO: time.Second, Wait: true}
	a, err := r.Pick(ctx, tokReq(4), po)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Pick(ctx, tokReq(4), po); err != nil {
		t.Fatalf("second worker free: %v", err)
	}
	if _, err := r.Pick(ctx, tokReq(4), po); !errors.Is(err, ErrWait) {
		t.Fatalf("both at max_num_seqs: %v, want ErrWait", err)
	}
	a.Done(200, response.Usage{}, time.Time{})
	tk, err := r.Pick(ctx, tokReq(4), po)
	if err != nil || tk.Worker != a.Worker {
		t.Fatalf("after Done: %v %v, want %s", tk, err, a.Worker)
	}
}

func TestSaturationDefaults(t *testing.T) {
	var s Saturation
	for _, c := range []struct {
		b    scoring.Booked
		want bool
	}{
		{scoring.Booked{PrefillTokens: 8191}, false},
		{scoring.Booked{PrefillTokens: 8000, Decoding: 192}, true},
		{scoring.Booked{Requests: 255}, false},
		{scoring.Booked{Requests: 256}, true},
	} {
		if got := s.Saturated(c.b); got != c.want {
			t.Errorf("Saturated(%+v) = %v, want %v", c.b, got, c.want)
		}
	}
}

// stickyPolicy always prefers worker a (its cached prefix, say) and predicts nothing.
type stickyPolicy struct{}

func (stickyPolicy) Name() string { return "sticky" }
func (stickyPolicy) Pick(in *scoring.Input, cands []scoring.Candidate) scoring.Decision {
	for i, c := range cands {
		if c.Worker.Name == "a" {
			return scoring.Decision{Index: i, Reason: scoring.ReasonBest}
		}
	}
	return scoring.Decision{Index: 0, Reason: scoring.ReasonBest}
}

// The policy's choice stands: with its preferred worker saturated the request waits
// although another has room (sending it elsewhere would give up its cache; waiting
// in the engine's queue or in kvroute's costs the same, and kvroute's is ordered).
func TestWaitFollowsThePolicysChoice(t *testing.T) {
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "a", Address: "10.0.0.1:8000", Models: []string{"m"}},
		{Name: "b", Address: "10.0.0.2:8000", Models: []string{"m"}}})
	r := New(Options{Registry: reg, Models: []Model{{Name: "m"}}, Policy: stickyPolicy{}, Saturation: Saturation{MaxNumSeqs: 1}})
	ctx := context.Background()
	po := PickOptions{SLO: time.Second, Wait: true}
	tk, err := r.Pick(ctx, tokReq(4), po)
	if err != nil || tk.Worker != "a" {
		t.Fatalf("first pick: %v %v", tk, err)
	}
	if _, err := r.Pick(ctx, tokReq(4), po); !errors.Is(err, ErrWait) {
		t.Fatalf("a saturated, b idle: %v, want ErrWait", err)
	}
	// no SLO: no waiting
	if tk, err := r.Pick(ctx, tokReq(4), PickOptions{Wait: true}); err != nil || tk.Worker != "a" {
		t.Fatalf("without SLO: %v %v", tk, err)
	}
}

// max_num_seqs comes from each worker's profile (vLLM --max-num-seqs of that engine):
// with profile.max_num_seqs 2 on both workers and no Saturation setting, the fifth
// request (two booked on each) waits. Before the fix the limit was 256 whatever the
// worker, and the fifth went through into the engine's own queue.
func TestWaitMaxNumSeqsFromWorkerProfile(t *testing.T) {
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "a", Address: "10.0.0.1:8000", Models: []string{"m"}, Profile: workers.Profile{MaxNumSeqs: 2}},
		{Name: "b", Address: "10.0.0.2:8000", Models: []string{"m"}, Profile: workers.Profile{MaxNumSeqs: 2}}})
	r := New(Options{Registry: reg, Models: []Model{{Name: "m"}}, Policy: slowPredictor{}, Saturation: Saturation{MaxNumSeqs: 1000}})
	ctx := context.Background()
	po := PickOptions{SLO: time.Second, Wait: true}
	per := map[string]int{}
	for i := 0; i < 4; i++ {
		tk, err := r.Pick(ctx, tokReq(4), po)
		if err != nil {
			t.Fatalf("pick %d: %v (below both workers' max_num_seqs)", i, err)
		}
		per[tk.Worker]++
	}
	if per["a"] != 2 || per["b"] != 2 {
		t.Fatalf("booked per worker %v, want 2 and 2", per)
	}
	if _, err := r.Pick(ctx, tokReq(4), po); !errors.Is(err, ErrWait) {
		t.Fatalf("both workers at their profile's max_num_seqs 2: %v, want ErrWait", err)
	}
}

func TestSaturatedOnWorkerProfile(t *testing.T) {
	b := scoring.Booked{Requests: 300}
	w := &workers.Worker{Profile: workers.Profile{MaxNumSeqs: 1024}}
	if (Saturation{}).SaturatedOn(w, b) || !(Saturation{}).SaturatedOn(nil, b) || !(Saturation{}).SaturatedOn(&workers.Worker{}, b) {
		t.Fatal("300 booked: want unsaturated under the profile's 1024, saturated under the default 256")
	}
	if !(Saturation{}).SaturatedOn(w, scoring.Booked{Requests: 1024}) {
		t.Fatal("1024 booked under the profile's 1024: want saturated")
	}
}
