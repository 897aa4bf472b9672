package scoring

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/workers"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestHotButBusyLosesToIdleCold: cache affinity is worth its prefill time, never more.
// A worker holding 8000 of 8192 tokens but with 50000 uncached tokens queued (10 s at
// 5000 tok/s) loses to an idle cold worker (1.6 s of recompute); with only 2000 queued
// (0.4 s) it wins.
func TestHotButBusyLosesToIdleCold(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(1)}, true)
	in := input(8192)
	busy := []Candidate{cand("hot", 8000, 50000), cand("cold", 0, 0)}
	if d := p.Pick(in, busy); busy[d.Index].Worker.Name != "cold" || d.Reason != ReasonBest {
		t.Fatalf("hot but busy must lose to idle cold when recomputing is faster: %+v", d)
	}
	light := []Candidate{cand("hot", 8000, 2000), cand("cold", 0, 0)}
	if d := p.Pick(in, light); light[d.Index].Worker.Name != "hot" {
		t.Fatalf("hot and lightly loaded must win: %+v", d)
	}
}

// TestTiesNeverByListOrder: equal predictions are spread uniformly; the first listed
// worker is not favoured.
func TestTiesNeverByListOrder(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(5)}, true)
	cs := cands(4)
	count := make([]int, 4)
	for k := 0; k < 4000; k++ {
		d := p.Pick(input(512), cs)
		if d.Reason != ReasonTie {
			t.Fatalf("equal predictions must report reason tie, got %q", d.Reason)
		}
		count[d.Index]++
	}
	for i, n := range count {
		if n < 850 || n > 1150 {
			t.Fatalf("tie broken unevenly: %v (worker %d got %d of 4000)", count, i, n)
		}
	}
}

// TestNearTieBrokenByInFlightTokens: within the margin, fewer in-flight tokens wins even
// if its prediction is slightly worse.
func TestNearTieBrokenByInFlightTokens(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(1), TieMargin: 0.05}, true)
	in := input(5000)
	a := cand("a", 0, 0)
	a.Booked = Booked{Requests: 3, Decoding: 3} // no queued prefill, slight decode interference
	b := cand("b", 0, 0)
	pa, pb := p.Predict(in, &a), p.Predict(in, &b)
	if !(pa.TTFT > pb.TTFT && pa.TTFT < pb.TTFT*105/100) {
		t.Fatalf("setup: want a slightly slower than b, got %v vs %v", pa.TTFT, pb.TTFT)
	}
	b.Booked.PrefillTokens = 0
	a.Booked.PrefillTokens = 0
	b.Booked.Requests = 0
	d := p.Pick(in, []Candidate{a, b})
	if d.Index != 1 || d.Reason != ReasonTie {
		t.Fatalf("near tie: fewest in-flight must win with reason tie, got %+v", d)
	}
	// Outside the margin the faster one wins outright.
	p0 := NewPredictor(Options{Rand: seeded(1), TieMargin: -1, TieMarginMin: time.Nanosecond}, true)
	if d := p0.Pick(in, []Candidate{b, a}); d.Index != 0 || d.Reason != ReasonBest {
		t.Fatalf("exact-tie margin: the faster must win with reason best, got %+v", d)
	}
}

func TestSLOPrefersWorkersMeetingIt(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(1)}, true)
	in := input(4000)
	in.SLO = 700 * time.Millisecond
	// cold: 0.82 s > SLO; warm: 0.52 s, the best prediction; hot: 0.523 s, meets the
	// SLO with the least prefill work (16 uncached tokens) and wins.
	cs := []Candidate{cand("cold", 0, 0), cand("warm", 2000, 500), cand("hot", 3984, 2500)}
	d := p.Pick(in, cs)
	if d.Reason != ReasonSLO || cs[d.Index].Worker.Name != "hot" {
		t.Fatalf("among workers meeting the SLO the least prefill work must win (reason slo): %+v", d)
	}
	// Nobody meets it: best overall, or shed when configured.
	in.SLO = time.Millisecond
	if d := p.Pick(in, cs); d.Reason == ReasonSLO || d.Shed {
		t.Fatalf("missed SLO without shedding: best effort expected, got %+v", d)
	}
	ps := NewPredictor(Options{Rand: seeded(1), ShedOnSLOMiss: true}, true)
	if d := ps.Pick(in, cs); !d.Shed || d.RetryAfter < time.Second {
		t.Fatalf("ShedOnSLOMiss must shed with Retry-After ≥ 1s, got %+v", d)
	}
}

// scoring.shed_on_slo_miss and a refusing class's calibrated threshold
// (admission.classes[].on_slo_miss: refuse, Input.RefuseAbove) do not stack: a request
// of a refusing class is refused or admitted by its threshold alone, shed_on_slo_miss or
// not; shed_on_slo_miss judges the other requests with an objective against the raw
// objective, and never a request without token information (docs/configuration.md).
func TestShedOnSLOMissYieldsToCalibratedRefusal(t *testing.T) {
	ps := NewPredictor(Options{Rand: seeded(1), ShedOnSLOMiss: true}, true)
	cs := []Candidate{cand("cold", 0, 0), cand("cold2", 0, 0)} // 4000 uncached tokens: ≈ 0.82 s
	in := input(4000)
	in.SLO = 700 * time.Millisecond
	if d := ps.Pick(in, cs); !d.Shed || d.Reason != ReasonSLO {
		t.Fatalf("shed_on_slo_miss: a request no worker is predicted to meet is shed (reason slo), got %+v", d)
	}
	// A refusing class whose margin is below 1 (the predictor over-estimated lately):
	// threshold 900 ms > 0.82 s, admitted although past the raw objective.
	in.RefuseOnSLOMiss, in.RefuseAbove = true, 900*time.Millisecond
	if d := ps.Pick(in, cs); d.Shed || d.Reason == ReasonSLO {
		t.Fatalf("under a refusing class's threshold the request is admitted with the usual placement, got %+v", d)
	}
	in.RefuseAbove = 600 * time.Millisecond // margin above 1: refused by its threshold
	if d := ps.Pick(in, cs); !d.Shed || d.Reason != ReasonSLO {
		t.Fatalf("past a refusing class's threshold the request is refused (reason slo), got %+v", d)
	}
	// Without tokens shed_on_slo_miss sheds nothing; a refusing class refuses on the
	// load-only prediction (a lower bound) against the raw objective.
	deg := &Input{Model: "m", Degraded: "no_tokenizer", Now: t0, SLO: time.Millisecond}
	busy := []Candidate{cand("a", 0, 50000), cand("b", 0, 60000)}
	if d := ps.Pick(deg, busy); d.Shed {
		t.Fatalf("shed_on_slo_miss shed a request without token information: %+v", d)
	}
	deg.RefuseOnSLOMiss = true
	if d := ps.Pick(deg, busy); !d.Shed || d.Reason != ReasonSLO {
		t.Fatalf("a refusing class without token information: refused on its load-only prediction, got %+v", d)
	}
}

func TestShedWhenBestExceedsMax(t *testing.T) {
	ms := metrics.NewUnregistered().Scoring
	p := NewPredictor(Options{Rand: seeded(1), MaxTTFT: 2 * time.Second, Metrics: ms}, true)
	in := input(1000)
	busy := []Candidate{cand("a", 0, 50000), cand("b", 0, 60000)} // 10 s and 12 s queues
	d := p.Pick(in, busy)
	if !d.Shed || d.Index != -1 {
		t.Fatalf("must shed when every worker is predicted over MaxTTFT, got %+v", d)
	}
	if d.RetryAfter < 8*time.Second || d.RetryAfter > 9*time.Second {
		t.Fatalf("Retry-After should be about the excess (≈8.2s), got %v", d.RetryAfter)
	}
	if testutil.ToFloat64(ms.Shed.WithLabelValues("kvroute")) != 1 {
		t.Fatal("shed not counted")
	}
	if d := p.Pick(in, []Candidate{cand("a", 0, 50000), cand("c", 0, 0)}); d.Shed || d.Index != 1 {
		t.Fatalf("one fast worker is enough not to shed: %+v", d)
	}
	in.DryRun = true
	p.Pick(in, busy)
	if testutil.ToFloat64(ms.Shed.WithLabelValues("kvroute")) != 1 {
		t.Fatal("dry-run (explain) picks must not be counted")
	}
}

func TestDegradedIsLoadOnly(t *testing.T) {
	ms := metrics.NewUnregistered().Scoring
	p := NewPredictor(Options{Rand: seeded(1), Metrics: ms}, true)
	in := &Input{Model: "m", Degraded: "no_tokenizer", Now: t0}
	cs := []Candidate{cand("a", 0, 4000), cand("b", 0, 100), cand("c", 0, 9000)}
	cs[1].Load = workers.Load{Waiting: 0, ScrapedAt: t0}
	d := p.Pick(in, cs)
	if d.Reason != ReasonDegraded || cs[d.Index].Worker.Name != "b" {
		t.Fatalf("degraded input must pick by load with reason degraded: %+v", d)
	}
	if testutil.ToFloat64(ms.Picks.WithLabelValues("kvroute", "degraded")) != 1 {
		t.Fatal("degraded pick not counted")
	}
}

func TestSimpleZeroValueWorks(t *testing.T) {
	var s Simple
	cs := []Candidate{cand("a", 0, 10000), cand("b", 0, 0)}
	if d := s.Pick(input(100), cs); d.Index != 1 {
		t.Fatalf("zero Simple must pick the idle worker: %+v", d)
	}
}

func TestDebugLogNamesTheTerms(t *testing.T) {
	var buf strings.Builder
	l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p := NewPredictor(Options{Rand: seeded(1), Logger: l}, true)
	in := input(1000)
	in.RequestID = "req-1"
	p.Pick(in, cands(2))
	for _, want := range []string{"request_id=req-1", "queue_s=", "prefill_s=", "overhead_s=", "ttft_s="} {
		if !strings.Contains(buf.String(), want) {
			t.Fatalf("debug log must carry %q: %s", want, buf.String())
		}
	}
	buf.Reset()
	in.DryRun = true
	p.Pick(in, cands(2))
	if buf.Len() != 0 {
		t.Fatal("explain (dry-run) picks are not logged")
	}
}

// TestNearTiePrefersPrefixBeingPrefilled: a prefix being prefilled on one worker (its
// blocks speculatively indexed, more than one engine step of its prefill booked) is not
// recomputed on an idle worker for a near-equal TTFT: waiting for it costs this request
// ~the same and saves the cluster a 6,000-token prefill. When the booked prefill fits
// in one step (batch 8192), vLLM would schedule both in the same step and recompute the
// uncommitted blocks anyway: no preference, the idle cold worker wins. With exact ties
// only, the 3 % faster cold worker wins too.
func TestNearTiePrefersPrefixBeingPrefilled(t *testing.T) {
	in := input(6200)
	mk := func() []Candidate { return []Candidate{cand("cold", 0, 0), cand("inflight", 6000, 6200)} }
	p := NewPredictor(Options{Rand: seeded(1), BatchTokens: 2048}, true)
	cs := mk()
	pc, pi := p.Predict(in, &cs[0]), p.Predict(in, &cs[1])
	if !(pc.TTFT < pi.TTFT && pi.TTFT < pc.TTFT*110/100) {
		t.Fatalf("setup: want cold slightly faster, within 10%%: cold %v, in flight %v", pc.TTFT, pi.TTFT)
	}
	if d := p.Pick(in, cs); cs[d.Index].Worker.Name != "inflight" || d.Reason != ReasonTie {
		t.Fatalf("near-tie must go to the least prefill work: %+v", d)
	}
	oneStep := NewPredictor(Options{Rand: seeded(1), BatchTokens: 8192}, true)
	cs = mk()
	if d := oneStep.Pick(in, cs); cs[d.Index].Worker.Name != "cold" || d.Reason != ReasonTie {
		t.Fatalf("an in-flight prefill within one step is recomputed anyway: the idle worker must win: %+v", d)
	}
	exact := NewPredictor(Options{Rand: seeded(1), BatchTokens: 2048, TieMargin: -1, TieMarginMin: time.Nanosecond}, true)
	cs = mk()
	if d := exact.Pick(in, cs); cs[d.Index].Worker.Name != "cold" || d.Reason != ReasonBest {
		t.Fatalf("with exact ties only the faster prediction wins: %+v", d)
	}
}
