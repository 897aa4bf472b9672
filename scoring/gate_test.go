package scoring

import (
	"math"
	"testing"
	"time"
)

// TestGateWeights: the combination weight's lower bound on synthetic departures. A
// learned prediction that is right (the baseline's error is exactly its departure, plus
// noise) enters in full; one that departs by pure noise does not enter; a term whose
// departure never varies is not scored; two terms whose departures always move together
// (collinear: the observations cannot tell them apart) stay at the baseline.
func TestGateWeights(t *testing.T) {
	rng := seeded(5)
	noise := func() float64 { return 0.02 * (rng.Float64() - 0.5) }
	var right, wrong, collinear gate
	for k := 0; k < 400; k++ {
		var d [NumTerms]float64
		d[TermPrefill] = 0.5 * rng.Float64()
		d[TermQueue] = 0.3 * rng.Float64()
		right.add(d[TermPrefill]+d[TermQueue]+noise(), d)
		wrong.add(noise(), d)
		var c [NumTerms]float64
		c[TermPrefill], c[TermQueue] = d[TermPrefill], d[TermPrefill]
		collinear.add(2*d[TermPrefill]+noise(), c)
	}
	w := right.weights()
	for _, tm := range []Term{TermPrefill, TermQueue} {
		if w[tm] < 0.9 || w[tm] > 1 {
			t.Errorf("right: weight %s = %.3f, want in [0.9, 1] (ŵ ≈ 1 less two standard errors)", tm, w[tm])
		}
	}
	for _, tm := range []Term{TermOverhead, TermLowerTier, TermDecode} {
		if w[tm] != 0 {
			t.Errorf("right: term %s never departed, weight %.3f, want 0", tm, w[tm])
		}
	}
	if w := wrong.weights(); w != [NumTerms]float64{} {
		t.Errorf("noise departures: weights %.3f, want all 0", w)
	}
	if w := collinear.weights(); w != [NumTerms]float64{} {
		t.Errorf("collinear departures: weights %.3f, want all 0 (not identified)", w)
	}
}

// TestGateOpensOnRegimeChange: 500 observations where the baseline is right (weight 0),
// then the truth doubles; the learned departure opens the gate within 50 observations
// although the 500 before argued against it.
func TestGateOpensOnRegimeChange(t *testing.T) {
	rng := seeded(6)
	var g gate
	for k := 0; k < 500; k++ {
		var d [NumTerms]float64
		d[TermPrefill] = 0.05 * (rng.Float64() - 0.5) // learned factors wandering by noise
		g.add(0.02*(rng.Float64()-0.5), d)
	}
	if w := g.weights()[TermPrefill]; w != 0 {
		t.Fatalf("before: weight %.3f, want 0", w)
	}
	for k := 0; k < 50; k++ {
		var d [NumTerms]float64
		z := 0.2 + 0.3*rng.Float64()
		d[TermPrefill] = 0.9 * z // the learner is most of the way to 2× (prior z, truth 2z)
		g.add(z*(1+0.05*(rng.Float64()-0.5)), d)
	}
	if w := g.weights()[TermPrefill]; w < 0.9 {
		t.Fatalf("after the change: weight %.3f, want ≥ 0.9", w)
	}
}

// gateStream feeds p a stream on identical-looking workers whose true factors are
// truth[name] (prior features, ±5 % noise) for n rounds, each worker picked alone.
// Observations carry no start time, so the decay toward the pool (pool.go) is not
// exercised: these tests isolate the gate.
func gateStream(p *Predictor, truth map[string][NumTerms]float64, names []string, n int, seed uint64) {
	rng := seeded(seed)
	for k := 0; k < n; k++ {
		for _, name := range names {
			in, c := synth(rng, name)
			in.Now = t0.Add(time.Duration(k) * time.Second)
			pred := p.Pick(in, []Candidate{c}).Predictions[0]
			th := truth[name]
			y := dot(&th, pred.Features) * (1 + 0.1*(rng.Float64()-0.5))
			p.Observe(Observation{Worker: name, PromptTokens: in.PromptTokens, CachedTokens: c.CachedTokens, Booked: c.Booked,
				Predicted: pred, TTFT: time.Duration(y * float64(time.Second))})
		}
	}
}

// TestPriorRightPredictsWithThePrior: where the prior is the truth, the learner's
// factors wander by noise, but none of it enters: every worker predicts with factors
// exactly 1, as kvroute_static does.
func TestPriorRightPredictsWithThePrior(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(2)}, true)
	names := []string{"a", "b", "c"}
	truth := map[string][NumTerms]float64{"a": unitTheta, "b": unitTheta, "c": unitTheta}
	gateStream(p, truth, names, 400, 11)
	moved := 0.0
	for _, name := range names {
		co, _ := p.Coefficients(name)
		if co.Factors != unitTheta {
			t.Errorf("%s: factors %.4f, want exactly the prior (weights %.2f, pool %.2f)", name, co.Factors, co.Weights, co.PoolWeights)
		}
		for _, f := range co.Learned {
			moved = max(moved, math.Abs(f-1))
		}
	}
	if moved == 0 {
		t.Fatal("setup: the learner's own factors should have moved by noise")
	}
}

// TestSlowWorkerStillLearns: of three workers configured alike, one is 2× slower in
// prefill and queue; its factors enter (within 10 % of 2 on both), the two whose prior
// is right keep factors 1 on those terms.
func TestSlowWorkerStillLearns(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(3)}, true)
	names := []string{"a", "b", "slow"}
	truth := map[string][NumTerms]float64{"a": unitTheta, "b": unitTheta, "slow": {1, 2, 2, 1, 1}}
	gateStream(p, truth, names, 400, 12)
	co, _ := p.Coefficients("slow")
	for _, tm := range []Term{TermPrefill, TermQueue} {
		if rel := math.Abs(co.Factors[tm]-2) / 2; rel > 0.10 {
			t.Errorf("slow: factor %s = %.3f, want 2 ± 10%% (weights %.2f, learned %.3f)", tm, co.Factors[tm], co.Weights, co.Learned)
		}
	}
	for _, name := range []string{"a", "b"} {
		co, _ := p.Coefficients(name)
		for _, tm := range []Term{TermPrefill, TermQueue} {
			if math.Abs(co.Factors[tm]-1) > 0.02 {
				t.Errorf("%s: factor %s = %.3f, want 1 ± 0.02 (weights %.2f, pool %.2f, learned %.3f)", name, tm, co.Factors[tm], co.Weights, co.PoolWeights, co.Learned)
			}
		}
	}
}

// TestDeparturesCombine: the departures split the learned prediction's departure from
// the baseline's exactly, (θ − base)·z = Σ_t d_t, and combine's factors predict what
// the weighted departures do, θ_used·z = base·z + Σ_t w_t·d_t; weight 1 everywhere is
// theta, 0 is base.
func TestDeparturesCombine(t *testing.T) {
	rng := seeded(8)
	for k := 0; k < 100; k++ {
		var theta, base, w [NumTerms]float64
		var z Features
		for i := range theta {
			theta[i], base[i], w[i], z[i] = 0.5+rng.Float64(), 0.5+rng.Float64(), rng.Float64(), rng.Float64()
		}
		d := departures(&theta, &base, z)
		sum, wsum := 0.0, 0.0
		for i := range d {
			sum += d[i]
			wsum += w[i] * d[i]
		}
		if got, want := sum, dot(&theta, z)-dot(&base, z); math.Abs(got-want) > 1e-12 {
			t.Fatalf("Σ d = %.6f, want (θ − base)·z = %.6f", got, want)
		}
		u := combine(base, theta, w)
		if got, want := dot(&u, z), dot(&base, z)+wsum; math.Abs(got-want) > 1e-12 {
			t.Fatalf("θ_used·z = %.6f, want base·z + Σ w·d = %.6f", got, want)
		}
		var one [NumTerms]float64
		for i := range one {
			one[i] = 1
		}
		if u, n := combine(base, theta, one), combine(base, theta, [NumTerms]float64{}); !near(u, theta) || !near(n, base) {
			t.Fatalf("weights 1: %.4f, want theta %.4f; weights 0: %.4f, want base %.4f", u, theta, n, base)
		}
	}
}

// TestQueueSharesThePrefillRate: the prior's prefill rate is 1.3× too fast, so the
// prefill of this request and of the queue ahead both take 1.3× the prior's seconds
// (the queue's feature is its tokens at the prefill rate, model.go). A queue is rarely
// there (1 observation in 20) and small, so its own factor is not identified: scored
// separately per term (the gate before rateOf) the queue's weight stays 0 and the gated
// model prices queued prefill at the prior's rate and one's own at the learned one.
// Scored as a shared rate, the learned rate enters both.
func TestQueueSharesThePrefillRate(t *testing.T) {
	rng := seeded(9)
	theta := [NumTerms]float64{1, 1.3, 1.3, 1, 1}
	var shared, separate gate
	for k := 0; k < 300; k++ {
		var z Features
		z[TermOverhead] = 0.02
		z[TermPrefill] = 0.05 + 2*rng.Float64()
		if k%20 == 0 {
			z[TermQueue] = 0.2 * rng.Float64()
		}
		y := dot(&theta, z) * (1 + 0.2*(rng.Float64()-0.5))
		e := y - dot(&unitTheta, z)
		shared.add(e, departures(&theta, &unitTheta, z))
		var d [NumTerms]float64
		for i := range d {
			d[i] = (theta[i] - 1) * z[i]
		}
		separate.add(e, d)
	}
	if w := separate.weights(); w[TermPrefill] < 0.9 || w[TermQueue] != 0 {
		t.Fatalf("setup: per-term weights %.3f, want prefill ≥ 0.9 and queue 0", w)
	}
	u := gated(theta, shared.weights())
	for _, tm := range []Term{TermPrefill, TermQueue} {
		if math.Abs(u[tm]-1.3) > 0.03 {
			t.Errorf("shared rate: factor %s = %.3f, want 1.3 ± 0.03 (weights %.3f)", tm, u[tm], shared.weights())
		}
	}
}

// near reports a and b equal within 1e-12 per term.
func near(a, b [NumTerms]float64) bool {
	for i := range a {
		if math.Abs(a[i]-b[i]) > 1e-12 {
			return false
		}
	}
	return true
}
