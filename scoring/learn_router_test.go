package scoring_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// TestRouterTicketsTeachThePredictor drives real router tickets in virtual time: every
// request's first token arrives after the TTFT a worker 2.5× slower than its profile
// would give; the predictor learns it from the tickets' observations and its
// predictions for that worker converge (last prediction within 5% of the truth).
func TestRouterTicketsTeachThePredictor(t *testing.T) {
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "w", Address: "10.0.0.1:8000", Models: []string{"m"},
		Profile: workers.Profile{PrefillTokensPerSecond: 10000, Overhead: 10 * time.Millisecond}}})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	pol := scoring.NewPredictor(scoring.Options{Rand: rand.New(rand.NewPCG(1, 1))}, true)
	r := router.New(router.Options{Registry: reg, Index: kvindex.New(kvindex.Options{Now: clock}), Policy: pol,
		Models: []router.Model{{Name: "m", BlockSize: 16}}, Now: clock})
	rng := rand.New(rand.NewPCG(2, 2))
	var last, truth time.Duration
	for i := 0; i < 200; i++ {
		n := 100 + rng.IntN(4000)
		tk, err := r.Pick(context.Background(), completion(tokens(1000+i, n)), router.PickOptions{})
		if err != nil {
			t.Fatal(err)
		}
		truth = 25*time.Millisecond + time.Duration(float64(n)/4000*float64(time.Second)) // 4000 tok/s, not 10000
		last = tk.Predicted.TTFT
		now = now.Add(truth)
		tk.FirstToken(now)
		tk.Done(200, responseUsage(), now.Add(time.Second))
		now = now.Add(time.Second)
	}
	co, ok := pol.Coefficients("w")
	if !ok || co.Observations != 200 {
		t.Fatalf("tickets must hand every first token to the learner: %+v", co)
	}
	if rel := float64(absDur(last-truth)) / float64(truth); rel > 0.05 {
		t.Fatalf("after 200 first tokens the prediction is %v for a true %v (%.0f%% off)", last, truth, rel*100)
	}
	if co.PrefillTokensPerSecond < 3600 || co.PrefillTokensPerSecond > 4400 {
		t.Fatalf("learned prefill rate %.0f tok/s, truth 4000", co.PrefillTokensPerSecond)
	}
}

// TestObserveConcurrentWithPick: Observe may run on any goroutine while the router
// picks (run with -race).
func TestObserveConcurrentWithPick(t *testing.T) {
	pol := scoring.NewPredictor(scoring.Options{Rand: rand.New(rand.NewPCG(1, 1))}, true)
	cs := []scoring.Candidate{{Worker: &workers.Worker{Name: "a"}}, {Worker: &workers.Worker{Name: "b"}}}
	in := &scoring.Input{PromptTokens: 1000, BlockSize: 16}
	pred := pol.Pick(in, cs).Predictions[0]
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 500; k++ {
				pol.Observe(scoring.Observation{Worker: "a", PromptTokens: 1000, Predicted: pred, TTFT: 300 * time.Millisecond})
			}
		}()
	}
	for k := 0; k < 500; k++ {
		pol.Pick(in, cs)
	}
	wg.Wait()
	if co, _ := pol.Coefficients("a"); co.Observations != 2000 {
		t.Fatalf("observations lost under concurrency: %d", co.Observations)
	}
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
