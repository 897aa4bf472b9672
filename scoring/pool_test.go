package scoring

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/workers"
)

// tau2Walk is τ² by the definition (pool.go): a walk of every learned worker's model,
// as updateTau2Locked computed it before it kept running sums.
func tau2Walk(p *Predictor) [NumTerms]float64 {
	var dev, noise, tau2 [NumTerms]float64
	n := 0
	for _, wm := range p.workers {
		if wm.est.n == 0 {
			continue
		}
		n++
		for t := range dev {
			d := wm.est.theta[t] - p.pool.est.theta[t]
			dev[t] += d * d
			noise[t] += wm.s2 * wm.est.p[t][t]
		}
	}
	if n < 2 {
		return tau2
	}
	for t := range dev {
		tau2[t] = max(0, (dev[t]-noise[t])/float64(n))
	}
	return tau2
}

// TestTau2RunningSumsMatchTheWalk: 48 workers of three true speeds learn from noisy
// TTFTs, with time passing (their deviations decay: FactorHalfLife) and workers removed
// and re-added; after every learned first token the τ² kept from running sums equals
// the full walk's to 1e-9 (relative, or absolute below 1e-12), and the sums' count is
// the number of learned workers.
func TestTau2RunningSumsMatchTheWalk(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(3), FactorHalfLife: 30 * time.Second}, true)
	rng := seeded(11)
	speeds := [][NumTerms]float64{{1, 1, 1, 1, 1, 1}, {1.6, 0.5, 0.7, 1, 1, 1}, {0.6, 2.5, 1.8, 1.2, 2, 1}}
	const nw, steps = 48, 6000
	nonzero := 0
	for k := 0; k < steps; k++ {
		w := rng.IntN(nw)
		name := fmt.Sprintf("w%02d", w)
		if k%97 == 96 { // a worker leaves; it starts again from its prior when picked next
			p.WorkerRemoved(&workers.Worker{Name: name})
		}
		in, c := synth(rng, name)
		in.Now = t0.Add(time.Duration(k) * 50 * time.Millisecond)
		pred := p.Pick(in, []Candidate{c}).Predictions[0]
		y := 0.0
		for i, f := range pred.Features {
			y += speeds[w%3][i] * f
		}
		y *= 1 + 0.2*(rng.Float64()-0.5)
		p.Observe(Observation{Worker: name, PromptTokens: in.PromptTokens, CachedTokens: c.CachedTokens, Booked: c.Booked,
			Predicted: pred, Start: in.Now, TTFT: time.Duration(y * float64(time.Second))})
		p.mu.RLock()
		got, want, learned := p.pool.tau2, tau2Walk(p), 0
		for _, wm := range p.workers {
			if wm.est.n > 0 {
				learned++
			}
		}
		n := p.pool.sums.n
		p.mu.RUnlock()
		if n != learned {
			t.Fatalf("step %d: sums count %d learned workers, the map holds %d", k, n, learned)
		}
		for i := range got {
			if d := math.Abs(got[i] - want[i]); d > 1e-12 && d > 1e-9*math.Abs(want[i]) {
				t.Fatalf("step %d term %s: τ² from sums %.15g, from the walk %.15g", k, Term(i), got[i], want[i])
			}
			if want[i] > 0 {
				nonzero++
			}
		}
	}
	if nonzero < steps { // the workers differ: τ² must be exercised away from its clamp at 0
		t.Fatalf("τ² was positive in only %d term-steps of %d", nonzero, steps*NumTerms)
	}
}

// TestTau2WalkResetsDrift: the full walk every tauResync changes rebuilds the sums: a
// sum corrupted on purpose (as float drift would, much slower) is gone after the walk.
func TestTau2WalkResetsDrift(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(5)}, true)
	rng := seeded(6)
	for k := 0; k < 40; k++ {
		name := fmt.Sprintf("w%d", k%4)
		in, c := synth(rng, name)
		pred := p.Pick(in, []Candidate{c}).Predictions[0]
		p.Observe(Observation{Worker: name, PromptTokens: in.PromptTokens, Predicted: pred, TTFT: time.Duration((0.5 + rng.Float64()) * pred.TTFT.Seconds() * float64(time.Second))})
	}
	p.mu.Lock()
	p.pool.sums.s2[TermPrefill] += 1e3
	p.pool.sums.changes = tauResync
	p.updateTau2Locked()
	got, want := p.pool.tau2, tau2Walk(p)
	p.mu.Unlock()
	for i := range got {
		if d := math.Abs(got[i] - want[i]); d > 1e-12 && d > 1e-9*math.Abs(want[i]) {
			t.Fatalf("after the walk τ² = %v, the walk's %v", got, want)
		}
	}
}

// BenchmarkObserveAt1000: one learned first token with 1,000 learned workers (the
// write-locked part of Observe: τ² was a walk of every worker, now running sums).
func BenchmarkObserveAt1000(b *testing.B) {
	p := NewPredictor(Options{Rand: seeded(1)}, true)
	rng := seeded(2)
	var os []Observation
	for w := 0; w < 1000; w++ {
		name := fmt.Sprintf("w%04d", w)
		in, c := synth(rng, name)
		pred := p.Pick(in, []Candidate{c}).Predictions[0]
		o := Observation{Worker: name, PromptTokens: in.PromptTokens, Predicted: pred, TTFT: time.Duration((0.8 + 0.4*rng.Float64()) * pred.TTFT.Seconds() * float64(time.Second))}
		p.Observe(o)
		os = append(os, o)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		p.Observe(os[i%len(os)])
	}
}
