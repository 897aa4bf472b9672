package scoring

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/response"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// synth draws a random candidate state for worker name: cached prefix (part of it in
// the CPU tier), booked queue, running decodes.
func synth(rng interface{ IntN(int) int }, name string) (*Input, Candidate) {
	in := input(256 + rng.IntN(8000))
	c := cand(name, 0, 0)
	if rng.IntN(2) == 0 {
		blocks := rng.IntN(in.PromptTokens / 16)
		if blocks > 0 {
			c.CachedTokens = min(blocks*16, in.PromptTokens-1)
			c.Cached = kvindex.Match{Worker: name, Blocks: blocks}
			cpu := rng.IntN(blocks + 1)
			c.Cached.ByTier[kvindex.TierCPU] = cpu
			c.Cached.ByTier[kvindex.TierGPU] = blocks - cpu
		}
	}
	if q := rng.IntN(3); q > 0 {
		c.Booked.Prefilling = q
		c.Booked.PrefillTokens = rng.IntN(20000)
	}
	c.Booked.Decoding = rng.IntN(64)
	c.Booked.Requests = c.Booked.Prefilling + c.Booked.Decoding
	return in, c
}

// TestHeterogeneousWorkersLearnTheirOwnRates: two workers whose true coefficients differ
// from the prior in opposite directions (a GPU 2× faster than the profile says, one 2×
// slower) each converge to their own: after 600 noisy observations (±5% multiplicative
// noise) the dominant factors (prefill, queue) are within 10% of the truth and the
// predictions' mean absolute percentage error over the last 100 observations is below
// 5%. The minor terms (overhead, lower tier, decode interference) are a few percent of
// these TTFTs, below the noise, so they are only weakly identified here; the next test
// shows overhead converging where it dominates.
func TestHeterogeneousWorkersLearnTheirOwnRates(t *testing.T) {
	truth := map[string][NumTerms]float64{
		"fast": {1.5, 0.5, 0.5, 0.8, 1.0},
		"slow": {0.7, 2.0, 2.0, 1.5, 3.0},
	}
	ms := metrics.NewUnregistered().Scoring
	p := NewPredictor(Options{Rand: seeded(7), Metrics: ms}, true)
	rng := seeded(42)
	ape := map[string]float64{}
	const n, tail = 600, 100
	for k := 0; k < n; k++ {
		for _, name := range []string{"fast", "slow"} {
			in, c := synth(rng, name)
			d := p.Pick(in, []Candidate{c})
			pred := d.Predictions[0]
			th := truth[name]
			y := 0.0
			for i := range th {
				y += th[i] * pred.Features[i]
			}
			y *= 1 + 0.1*(rng.Float64()-0.5)
			if k >= n-tail {
				ape[name] += math.Abs(pred.TTFT.Seconds()-y) / y / tail
			}
			p.Observe(Observation{Worker: name, PromptTokens: in.PromptTokens, CachedTokens: c.CachedTokens, Booked: c.Booked,
				Predicted: pred, TTFT: time.Duration(y * float64(time.Second))})
		}
	}
	for name, th := range truth {
		co, ok := p.Coefficients(name)
		if !ok || co.Observations != n {
			t.Fatalf("%s: %d observations learned, want %d", name, co.Observations, n)
		}
		for _, i := range []Term{TermPrefill, TermQueue} {
			if rel := math.Abs(co.Factors[i]-th[i]) / th[i]; rel > 0.10 {
				t.Errorf("%s: factor %s = %.3f, truth %.3f (%.0f%% off, want ≤10%%)", name, Term(i), co.Factors[i], th[i], rel*100)
			}
		}
		if ape[name] > 0.05 {
			t.Errorf("%s: MAPE over the last %d = %.1f%%, want < 5%%", name, tail, ape[name]*100)
		}
		t.Logf("%s: factors %.3f prefill %.0f tok/s overhead %.1f ms MAPE %.2f%%", name, co.Factors, co.PrefillTokensPerSecond, co.OverheadSeconds*1000, ape[name]*100)
	}
	fastCo, _ := p.Coefficients("fast")
	slowCo, _ := p.Coefficients("slow")
	if fastCo.PrefillTokensPerSecond < 3*slowCo.PrefillTokensPerSecond {
		t.Fatalf("learned prefill rates must differ ~4×: fast %.0f slow %.0f", fastCo.PrefillTokensPerSecond, slowCo.PrefillTokensPerSecond)
	}
	if got := testutil.ToFloat64(ms.PrefillRate.WithLabelValues("fast")); math.Abs(got-fastCo.PrefillTokensPerSecond) > 1 {
		t.Fatalf("prefill rate gauge %.0f != learned %.0f", got, fastCo.PrefillTokensPerSecond)
	}
	if testutil.CollectAndCount(ms.APE) != 2 {
		t.Fatalf("APE histogram must have one series per worker")
	}
}

// TestOverheadLearnedWhereItDominates: short prompts on an idle worker (TTFT ≈
// overhead) teach the overhead within 10% after 300 observations with ±5% noise.
func TestOverheadLearnedWhereItDominates(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(3)}, true)
	rng := seeded(9)
	const trueOverhead, trueRate = 0.045, 4000.0
	for k := 0; k < 300; k++ {
		in := input(1 + rng.IntN(64))
		c := cand("a", 0, 0)
		pred := p.Pick(in, []Candidate{c}).Predictions[0]
		y := (trueOverhead + float64(in.PromptTokens)/trueRate) * (1 + 0.1*(rng.Float64()-0.5))
		p.Observe(Observation{Worker: "a", PromptTokens: in.PromptTokens, Predicted: pred, TTFT: time.Duration(y * float64(time.Second))})
	}
	co, _ := p.Coefficients("a")
	if rel := math.Abs(co.OverheadSeconds-trueOverhead) / trueOverhead; rel > 0.10 {
		t.Fatalf("overhead learned %.1f ms, truth %.1f ms", co.OverheadSeconds*1000, trueOverhead*1000)
	}
}

func TestLearningIsRobustAndBounded(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(1)}, true)
	in := input(4000)
	c := cand("a", 0, 0)
	pred := p.Pick(in, []Candidate{c}).Predictions[0]
	// One 50× stall moves the factors by a bounded step (residual clipped at 50%).
	p.Observe(Observation{Worker: "a", PromptTokens: 4000, Predicted: pred, TTFT: 50 * pred.TTFT})
	co, _ := p.Coefficients("a")
	for i, f := range co.Factors {
		if f > 1.6 {
			t.Fatalf("one outlier moved factor %s to %.2f; the clipped residual must bound the step", Term(i), f)
		}
	}
	// A persistent absurd observation saturates at the clamp, never beyond.
	for k := 0; k < 2000; k++ {
		p.Observe(Observation{Worker: "a", PromptTokens: 4000, Predicted: pred, TTFT: 1000 * pred.TTFT})
	}
	co, _ = p.Coefficients("a")
	for i, f := range co.Factors {
		if f > 20+1e-9 || f < 1.0/20-1e-9 || math.IsNaN(f) {
			t.Fatalf("factor %s = %v escaped the clamp [1/20, 20]", Term(i), f)
		}
	}
}

func TestObserveSkipsWhatItCannotLearn(t *testing.T) {
	ms := metrics.NewUnregistered().Scoring
	p := NewPredictor(Options{Rand: seeded(1), Metrics: ms}, true)
	p.Observe(Observation{Worker: "a", TTFT: time.Second}) // predicted by another policy: no features
	p.Observe(Observation{Worker: "a"})                    // no TTFT (non-streamed)
	if _, ok := p.Coefficients("a"); ok {
		t.Fatal("observations without features or TTFT must not create a model")
	}
	if got := testutil.ToFloat64(ms.Observations.WithLabelValues("a", "skipped")); got != 1 {
		t.Fatalf("skipped observations = %v, want 1", got)
	}
	// The completion report never teaches TTFT a second time.
	in := input(1000)
	c := cand("a", 0, 0)
	pred := p.Pick(in, []Candidate{c}).Predictions[0]
	p.Observe(Observation{Worker: "a", PromptTokens: 1000, Predicted: pred, TTFT: time.Second})
	p.Observe(Observation{Worker: "a", PromptTokens: 1000, Predicted: pred, TTFT: time.Second, E2E: 3 * time.Second})
	if co, _ := p.Coefficients("a"); co.Observations != 1 {
		t.Fatalf("learned %d times from one request, want 1", co.Observations)
	}
	// Static policy never learns.
	s := NewPredictor(Options{Rand: seeded(1)}, false)
	s.Pick(in, []Candidate{c})
	s.Observe(Observation{Worker: "a", Predicted: pred, TTFT: 10 * time.Second})
	if co, _ := s.Coefficients("a"); co.Observations != 0 || co.Factors != unitTheta {
		t.Fatalf("kvroute_static must keep its prior, got %+v", co)
	}
}

func TestProfileChangeRestartsLearning(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(1)}, true)
	in := input(1000)
	c := cand("a", 0, 0)
	pred := p.Pick(in, []Candidate{c}).Predictions[0]
	p.Observe(Observation{Worker: "a", PromptTokens: 1000, Predicted: pred, TTFT: 2 * pred.TTFT})
	c.Worker.Profile.PrefillTokensPerSecond = 10000
	p.Pick(in, []Candidate{c})
	// The worker's own estimate restarts at the new prior; what the pool learned (how far
	// priors are off in general) still applies to it.
	if co, _ := p.Coefficients("a"); co.Observations != 0 || co.Own != unitTheta ||
		math.Abs(co.PrefillTokensPerSecond-10000/co.Factors[TermPrefill]) > 1e-6 {
		t.Fatalf("a new profile must restart the worker's model from it, got %+v", co)
	}
}

func TestCachedTokensDrift(t *testing.T) {
	ms := metrics.NewUnregistered().Scoring
	p := NewPredictor(Options{Rand: seeded(1), Metrics: ms}, true)
	done := func(index, engine int, reported bool) {
		p.Observe(Observation{Worker: "a", CachedTokens: index, E2E: time.Second, TTFT: 100 * time.Millisecond,
			Usage: response.Usage{Present: true, PromptTokens: 4000, CachedTokens: engine, CachedReported: reported}})
	}
	done(1024, 512, true)  // index promised more
	done(0, 256, true)     // engine reused what the index did not know
	done(2048, 2048, true) // agree
	done(1024, 0, false)   // absent (vLLM without --enable-prompt-tokens-details, or zero): no information
	done(1024, 0, true)    // an explicit 0 against a prediction of 1024: the index promised more
	if got := testutil.ToFloat64(ms.CachedTokensMismatch.WithLabelValues("index_over")); got != 2 {
		t.Fatalf("index_over = %v, want 2 (an explicit 0 is evidence, absent is not)", got)
	}
	if got := testutil.ToFloat64(ms.CachedTokensMismatch.WithLabelValues("index_under")); got != 1 {
		t.Fatalf("index_under = %v, want 1", got)
	}
	if n := testutil.CollectAndCount(ms.CachedTokensError); n != 1 {
		t.Fatalf("drift histogram series = %d", n)
	}
}

func TestWorkerRemovedForgetsModelAndSeries(t *testing.T) {
	ms := metrics.NewUnregistered().Scoring
	p := NewPredictor(Options{Rand: seeded(1), Metrics: ms}, true)
	c := cand("a", 0, 0)
	pred := p.Pick(input(1000), []Candidate{c}).Predictions[0]
	p.Observe(Observation{Worker: "a", PromptTokens: 1000, Predicted: pred, TTFT: time.Second})
	if testutil.CollectAndCount(ms.PrefillRate) != 1 {
		t.Fatal("setup: gauge missing")
	}
	p.WorkerRemoved(c.Worker)
	if _, ok := p.Coefficients("a"); ok {
		t.Fatal("a removed worker's model must be dropped")
	}
	if n := testutil.CollectAndCount(ms.PrefillRate) + testutil.CollectAndCount(ms.Factor) + testutil.CollectAndCount(ms.APE); n != 0 {
		t.Fatalf("a removed worker's series must be deleted, %d left", n)
	}
}
