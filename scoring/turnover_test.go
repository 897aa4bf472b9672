package scoring

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
)

func TestTurnoverPriceIsChesEvictionProbabilityTimesTheRecompute(t *testing.T) {
	// 30,000-token LRU written at 3,000 tok/s: T = 10 s; reuse interval 5 s:
	// P(evicted) = exp(−2) = 0.1353; 2,000 tokens at 8,000 tok/s = 0.25 s.
	if got, want := turnoverPrice(2000, 30000, 3000, 5, 8000), math.Exp(-2)*0.25; math.Abs(got-want) > 1e-12 {
		t.Fatalf("price %.6f, want %.6f", got, want)
	}
	if got := turnoverPrice(2000, 30000, 3000, 5, 8000); math.Abs(got-0.033834) > 1e-6 {
		t.Fatalf("price %.6f, want 0.033834", got)
	}
	// A cache that turns over far slower than contexts return costs nothing.
	if got := turnoverPrice(2000, 1e6, 100, 5, 8000); got > 1e-12 {
		t.Fatalf("big cache: price %g, want ≈ 0", got)
	}
	for _, c := range [][5]float64{{0, 30000, 3000, 5, 8000}, {2000, 0, 3000, 5, 8000}, {2000, 30000, 0, 5, 8000}, {2000, 30000, 3000, 0, 8000}, {2000, 30000, 3000, 5, 0}} {
		if got := turnoverPrice(c[0], c[1], c[2], c[3], c[4]); got != 0 {
			t.Fatalf("unknown input %v: price %g, want 0", c, got)
		}
	}
}

func TestTurnoverCostAddsTheRiseOfTheCachedContextsEviction(t *testing.T) {
	own := turnoverPrice(2000, 30000, 3000, 5, 8000)
	if got := turnoverCost(2000, 30000, 3000, 3000, 5, 8000); got != own {
		t.Fatalf("no writes added: cost %g, want the own price %g", got, own)
	}
	// 3,000 → 3,750 tok/s: T 10 → 8 s; the 30,000 cached tokens' eviction probability
	// rises exp(−2) → exp(−1.6), 3.75 s of recompute each.
	want := turnoverPrice(2000, 30000, 3750, 5, 8000) + (math.Exp(-1.6)-math.Exp(-2))*30000/8000
	if got := turnoverCost(2000, 30000, 3000, 3750, 5, 8000); math.Abs(got-want) > 1e-12 || math.Abs(got-0.3001) > 1e-4 {
		t.Fatalf("cost %.6f, want %.6f", got, want)
	}
}

func keys(n int) []kvindex.Key {
	out := make([]kvindex.Key, n)
	for i := range out {
		out[i] = kvindex.Key(1000 + i)
	}
	return out
}

func TestReuseClockMeasuresTheIntervalOfAPromptThatExtendsAnother(t *testing.T) {
	var r reuseClock
	r.horizon = time.Minute
	if k, _ := sampledKey(keys(20)); k != 1016 {
		t.Fatalf("sampled key %d, want index 16 (1016)", k)
	}
	if _, ok := sampledKey(nil); ok {
		t.Fatal("empty prompt has no sampled key")
	}
	if sec, found := r.interval(keys(40), t0); found || sec != 0 {
		t.Fatalf("empty clock: %g %v, want 0 false", sec, found)
	}
	r.record(keys(40), t0, 0, false) // turn 1: remembered by key index 32
	sec, found := r.interval(keys(60), t0.Add(4*time.Second))
	if !found || sec != 4 {
		t.Fatalf("turn 2: %g %v, want 4 s found", sec, found)
	}
	r.record(keys(60), t0.Add(4*time.Second), sec, found)
	if r.mean != 4 {
		t.Fatalf("mean %g, want 4 (first measurement)", r.mean)
	}
	sec, found = r.interval(keys(80), t0.Add(10*time.Second)) // extends turn 2 (index 48), 6 s later
	r.record(keys(80), t0.Add(10*time.Second), sec, found)
	if !found || sec != 6 || math.Abs(r.mean-4.1) > 1e-12 {
		t.Fatalf("turn 3: %g %v mean %g, want 6 s found, mean 4 + 0.05·2 = 4.1", sec, found, r.mean)
	}
	other := []kvindex.Key{7, 8, 9}
	if sec, found := r.interval(other, t0.Add(11*time.Second)); found || sec != 4.1 {
		t.Fatalf("unrelated prompt: %g %v, want the mean 4.1 not found", sec, found)
	}
}

func TestReuseClockDropsOldPromptsAtItsCap(t *testing.T) {
	r := reuseClock{horizon: time.Minute, last: map[kvindex.Key]time.Time{}}
	for i := range reuseCap - 1 {
		r.last[kvindex.Key(i)] = t0
	}
	r.last[kvindex.Key(reuseCap)] = t0.Add(2 * time.Minute)
	r.record([]kvindex.Key{1 << 40}, t0.Add(2*time.Minute+time.Second), 0, false)
	if len(r.last) != 2 {
		t.Fatalf("%d prompts kept, want 2 (the recent one and the new one)", len(r.last))
	}
	for i := range reuseCap {
		r.last[kvindex.Key(i)] = t0.Add(2 * time.Minute) // all recent: none can be dropped by age
	}
	r.record([]kvindex.Key{1 << 41}, t0.Add(2*time.Minute+time.Second), 0, false)
	if len(r.last) != 1 {
		t.Fatalf("%d prompts kept, want 1 (cleared, then the new one)", len(r.last))
	}
}

// TestCacheTurnoverMovesAContextOffAFastTurningCache: "busy" holds half the prompt but
// its 32,000-token cache was written 100,000 tokens over the last window (T ≈ 14 s);
// the conversation returns every 60 s, so its context would not survive there. Without
// the price the holder wins on TTFT; with it the idle worker (T = ∞) does.
func TestCacheTurnoverMovesAContextOffAFastTurningCache(t *testing.T) {
	setup := func(on bool) (*Predictor, *Input, []Candidate) {
		p := NewPredictor(Options{Rand: seeded(1), CacheTurnover: on}, false)
		busy, quiet := cand("busy", 1008, 0), cand("quiet", 0, 0)
		busy.Worker.Profile.BlockCapacity, quiet.Worker.Profile.BlockCapacity = 2000, 2000
		load := input(100000)
		load.Now = t0.Add(-time.Millisecond)
		p.Pick(load, []Candidate{cand("busy", 0, 0)})
		p.reuse.horizon = 10 * time.Minute
		p.reuse.record(keys(113), t0.Add(-time.Minute), 0, false)
		in := input(2000)
		in.Keys = keys(125)
		return p, in, []Candidate{busy, quiet}
	}
	p, in, cs := setup(false)
	if d := p.Pick(in, cs); d.Index != 0 {
		t.Fatalf("off: the holder must win on TTFT, got %d %+v", d.Index, d.Predictions)
	}
	p, in, cs = setup(true)
	if d := p.Pick(in, cs); d.Index != 1 {
		t.Fatalf("on: the idle cache must win, got %d %+v", d.Index, d.Predictions)
	}
	if p.reuse.mean != 60 {
		t.Fatalf("measured reuse interval %g s, want 60", p.reuse.mean)
	}
	in.Now = t0.Add(time.Second)
	if sec, found := p.reuse.interval(keys(130), in.Now); !found || sec != 1 {
		t.Fatalf("the pick must be remembered: %g %v, want 1 s found", sec, found)
	}
}
