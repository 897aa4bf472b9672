package router

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// picked is a ticket as Pick leaves it for the margins: class cp, admitted at t0 on
// prediction pred.
func picked(cp ClassPolicy, pred time.Duration) *Ticket {
	return &Ticket{Start: t0, slo: cp, sloPred: pred}
}

// The margins settle at the quantiles of observed ÷ predicted TTFT: fed ratios drawn
// uniformly from [1, 2] (a predictor that under-estimates by 1–2×), the 90th percentile
// margin converges near 1.9 and the median near 1.5; they never leave [0.5, 8].
func TestSLOMarginsTrackRatioQuantiles(t *testing.T) {
	var s sloMargins
	if m, m50, p := s.margins(""); m != 1 || m50 != 1 || p != 1 {
		t.Fatalf("initial margins %v %v %v, want 1 1 1", m, m50, p)
	}
	cp := ClassPolicy{SLO: time.Hour}
	rng := rand.New(rand.NewPCG(1, 2))
	pred := time.Second
	for i := 0; i < 20000; i++ {
		s.observe(picked(cp, pred), time.Duration((1+rng.Float64())*float64(pred)))
	}
	m, m50, _ := s.margins("")
	if math.Abs(m-1.9) > 0.1 || math.Abs(m50-1.5) > 0.1 {
		t.Fatalf("margins %.3f (p90) %.3f (p50), want ≈ 1.9 and ≈ 1.5", m, m50)
	}
	for i := 0; i < 10000; i++ {
		s.observe(picked(cp, pred), 100*pred)
	}
	if m, m50, _ := s.margins(""); m != sloMarginMax || m50 != sloMarginMax {
		t.Fatalf("upper bound: %v %v", m, m50)
	}
	for i := 0; i < 100000; i++ {
		s.observe(picked(cp, pred), 0)
	}
	if m, m50, _ := s.margins(""); m != sloMarginMin || m50 != sloMarginMin {
		t.Fatalf("lower bound: %v %v", m, m50)
	}
}

// A ticket is counted once: at its first token, or — streamed, none by its deadline —
// as a miss at the first pick after the deadline; a later first token changes nothing.
// A pick without a prediction moves no margin.
func TestSLOMarginsCountAMissAtTheDeadline(t *testing.T) {
	var s sloMargins
	cp := ClassPolicy{SLO: time.Second, RefuseOnSLOMiss: true}
	tk := picked(cp, 500*time.Millisecond)
	s.admitted(tk, true, t0)
	if got := limitOf(&s, cp, t0.Add(999*time.Millisecond)); got != time.Second {
		t.Fatalf("threshold before the deadline %v, want 1s (margin 1)", got)
	}
	got := limitOf(&s, cp, t0.Add(time.Second))
	// one miss raises the margin and the class's own correction by one step each
	want := time.Duration(float64(time.Second) / math.Exp(2*sloMarginStep*0.9))
	if math.Abs(float64(got-want)) > float64(time.Microsecond) {
		t.Fatalf("threshold after the deadline %v, want %v (one miss)", got, want)
	}
	s.observe(tk, 2*time.Second) // the late first token: already counted
	if g := limitOf(&s, cp, t0.Add(time.Second)); g != got {
		t.Fatalf("threshold moved on a second count: %v → %v", got, g)
	}
	s.observe(picked(cp, 0), 10*time.Second) // no prediction: margins stay
	if g := limitOf(&s, cp, t0.Add(time.Second)); g != got {
		t.Fatalf("a pick without a prediction moved the margin: %v → %v", got, g)
	}
	// non-streamed: not on the deadline heap; counted met when it completes in time
	s.admitted(picked(cp, time.Second), false, t0)
	if len(s.due) != 0 {
		t.Fatalf("a non-streamed ticket is on the deadline heap")
	}
	// a client's objective of days is not held on the heap, and the heap is bounded
	s.admitted(picked(ClassPolicy{SLO: 240 * time.Hour}, time.Second), true, t0)
	if len(s.due) != 0 {
		t.Fatalf("a ticket with a 10-day objective is on the deadline heap")
	}
	for i := 0; i < sloMaxDue+10; i++ {
		s.admitted(picked(ClassPolicy{SLO: time.Minute}, time.Second), true, t0)
	}
	if len(s.due) != sloMaxDue {
		t.Fatalf("deadline heap holds %d tickets, bound %d", len(s.due), sloMaxDue)
	}
}

// Priority: while a class of higher priority misses its attainment, every lower class
// is refused at a tighter threshold (its pressure divides it); the higher class itself
// is refused at the median margin; when it meets again, the pressure returns to 1.
func TestSLOPressureProtectsTheHigherClass(t *testing.T) {
	var s sloMargins
	hi := ClassPolicy{SLO: 8 * time.Second, RefuseOnSLOMiss: true, Class: "hi", Priority: 10, Attainment: 0.95}
	lo := ClassPolicy{SLO: 8 * time.Second, RefuseOnSLOMiss: true, Class: "lo"}
	limitOf(&s, hi, t0)
	if g := limitOf(&s, lo, t0); g != 8*time.Second {
		t.Fatalf("lo threshold with no feedback %v, want 8s", g)
	}
	for i := 0; i < 40; i++ {
		s.refused(hi)
	}
	_, _, p := s.margins("hi")
	want := math.Exp(40 * sloMarginStep * 0.95)
	if math.Abs(p-want) > 1e-9 {
		t.Fatalf("hi pressure %v after 40 refusals, want %v", p, want)
	}
	if g, w := limitOf(&s, lo, t0), time.Duration(float64(8*time.Second)/want); math.Abs(float64(g-w)) > float64(time.Microsecond) {
		t.Fatalf("lo threshold %v, want %v", g, w)
	}
	if g := limitOf(&s, hi, t0); g != 8*time.Second {
		t.Fatalf("hi is not pressed by itself or by lower classes: %v", g)
	}
	// hi's margin is the median one: ratios 1..2 give p50 ≈ 1.5 while p90 ≈ 1.9
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 20000; i++ {
		s.observe(picked(hi, time.Second), time.Duration((1+rng.Float64())*float64(time.Second)))
	}
	m, m50, p := s.margins("hi")
	if p != 1 {
		t.Fatalf("hi pressure %v after 20,000 met requests, want 1", p)
	}
	if g, w := limitOf(&s, hi, t0), time.Duration(float64(8*time.Second)/m50); g != w || m50 >= m {
		t.Fatalf("hi threshold %v, want %v (median margin %v < p90 %v)", g, w, m50, m)
	}
	if g, w := limitOf(&s, lo, t0), time.Duration(float64(8*time.Second)/m); g != w {
		t.Fatalf("lo threshold %v, want %v (p90 margin, no pressure)", g, w)
	}
}

// A class whose admitted requests miss more often than its attainment allows tightens
// its own threshold beyond the margin: ratios that put the margin at p90 but 30 % of
// the admitted past the objective (the margin is fed other, quieter requests' ratios
// too) raise the correction; refusals do not move it; once the admitted meet, it
// returns to 1 and the threshold is the margin's again.
func TestSLOSelfCorrectionFromAdmittedMisses(t *testing.T) {
	var s sloMargins
	cp := ClassPolicy{SLO: 8 * time.Second, RefuseOnSLOMiss: true, Class: "c"}
	limitOf(&s, cp, t0)
	for i := 0; i < 100; i++ {
		s.refused(cp)
	}
	if g := limitOf(&s, cp, t0); g != 8*time.Second {
		t.Fatalf("refusals moved the threshold: %v", g)
	}
	// 3 in 10 admitted miss (ratio 2 on a 6 s prediction: 12 s), 7 meet at ratio 1
	for i := 0; i < 3000; i++ {
		r := time.Duration(6 * float64(time.Second))
		if i%10 < 3 {
			r *= 2
		}
		s.observe(picked(cp, 6*time.Second), r)
	}
	m, _, _ := s.margins("c")
	tight := limitOf(&s, cp, t0)
	if byMargin := time.Duration(float64(8*time.Second) / m); tight > byMargin/4 {
		t.Fatalf("30 %% of the admitted miss: threshold %v, want well under the margin's %v", tight, byMargin)
	}
	for i := 0; i < 3000; i++ {
		s.observe(picked(cp, 6*time.Second), 6*time.Second)
	}
	m, _, _ = s.margins("c")
	if g, w := limitOf(&s, cp, t0), time.Duration(float64(8*time.Second)/m); g != w {
		t.Fatalf("admitted meet again: threshold %v, want the margin's %v", g, w)
	}
}

// The per-class state is bounded: past sloMaxClasses names, new ones share "".
func TestSLOClassesBounded(t *testing.T) {
	var s sloMargins
	for i := 0; i < 3*sloMaxClasses; i++ {
		s.refused(ClassPolicy{SLO: time.Second, Class: string(rune('a'+i%26)) + string(rune(i))})
	}
	if len(s.classes) > sloMaxClasses+1 { // + the shared ""
		t.Fatalf("%d classes kept, bound %d", len(s.classes), sloMaxClasses+1)
	}
}

// limitOf is threshold's refusal limit alone.
func limitOf(s *sloMargins, cp ClassPolicy, now time.Time) time.Duration {
	l, _, _, _ := s.threshold(cp, now)
	return l
}

// threshold hands back the margin and the class's own pressure it read: the values
// margins reports (the gauges are set from them).
func TestSLOThresholdReportsWhatItRead(t *testing.T) {
	var s sloMargins
	hi := ClassPolicy{SLO: 8 * time.Second, RefuseOnSLOMiss: true, Class: "hi", Priority: 10}
	for i := 0; i < 10; i++ {
		s.refused(hi)
		s.observe(picked(hi, time.Second), 3*time.Second)
	}
	_, m, p, _ := s.threshold(hi, t0)
	wm, _, wp := s.margins("hi")
	if m != wm || p != wp || m <= 1 || p <= 1 {
		t.Fatalf("threshold read margin %v pressure %v, margins says %v %v (both > 1 after misses)", m, p, wm, wp)
	}
}
