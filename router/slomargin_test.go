package router

import (
	"math"
	"testing"
	"time"
)

// The margin settles where a fraction sloMissTarget of admitted requests miss: fed a
// stream in which a request misses whenever margin < 1.5 (a predictor that
// under-estimates by 1.5×), it converges near 1.5; after the burst, requests that all
// meet bring it back down at η·α per request; it never leaves [0.5, 8].
func TestSLOMarginTracksTheMissRate(t *testing.T) {
	var m sloMargin
	if m.get() != 1 {
		t.Fatalf("initial margin %v, want 1", m.get())
	}
	slo := time.Second
	for i := 0; i < 5000; i++ {
		ttft := time.Duration(1.5 / m.get() * float64(slo)) // observed = 1.5 × the admitted prediction ≤ slo/m
		m.observe(ttft+time.Nanosecond, slo)
	}
	if g := m.get(); math.Abs(g-1.5) > 0.15 {
		t.Fatalf("margin %v after 5,000 requests of a 1.5× under-estimating predictor, want ≈ 1.5", g)
	}
	before := m.get()
	for i := 0; i < 100; i++ {
		m.observe(slo/2, slo)
	}
	want := before * math.Exp(-100*sloMarginStep*sloMissTarget)
	if g := m.get(); math.Abs(g-want) > 1e-9 {
		t.Fatalf("after 100 met: %v, want %v", g, want)
	}
	for i := 0; i < 10000; i++ {
		m.observe(time.Hour, slo)
	}
	if m.get() != sloMarginMax {
		t.Fatalf("upper bound: %v", m.get())
	}
	for i := 0; i < 100000; i++ {
		m.observe(0, slo)
	}
	if m.get() != sloMarginMin {
		t.Fatalf("lower bound: %v", m.get())
	}
}
