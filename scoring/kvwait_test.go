package scoring

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/workers"
)

// kvFull is a worker with 1,000 blocks of 16 tokens (16,000 tokens of KV) at the given
// scraped usage.
func kvFull(name string, usage float64, booked int) Candidate {
	c := cand(name, 0, booked)
	c.Worker.Profile.BlockCapacity = 1000
	c.Load = workers.Load{KVUsage: usage, ScrapedAt: t0}
	return c
}

// TestKVWaitFormula: 90 % of 16,000 tokens held, 4,000 needed: 2,400 tokens must be
// freed; the running requests free the whole cache in D = 10 s, so 2,400 take 1.5 s.
// No wait when it fits, without a scrape, a capacity or a decode time.
func TestKVWaitFormula(t *testing.T) {
	in := input(1000)
	c := kvFull("w", 0.9, 0)
	v := workerView{decode: 10}
	if got := kvWait(in, &c, v, 4000); math.Abs(got-1.5) > 1e-9 {
		t.Fatalf("kvWait = %v s, want 1.5", got)
	}
	if got := kvWait(in, &c, v, 1600); got != 0 {
		t.Fatalf("1,600 tokens fit in the 1,600 free: wait %v, want 0", got)
	}
	c2 := c
	c2.Load.KVUsage = 7 // a bogus scrape is clamped to a full cache: 4,000 × 10 ÷ 16,000
	if got := kvWait(in, &c2, v, 4000); math.Abs(got-2.5) > 1e-9 {
		t.Fatalf("usage clamped to 1: wait %v, want 2.5", got)
	}
	for name, mod := range map[string]func(*Candidate, *workerView){
		"no scrape":   func(c *Candidate, _ *workerView) { c.Load.ScrapedAt = time.Time{} },
		"no capacity": func(c *Candidate, _ *workerView) { c.Worker.Profile.BlockCapacity = 0 },
		"no decode":   func(_ *Candidate, v *workerView) { v.decode = 0 },
	} {
		c3, v3 := kvFull("w", 0.9, 0), v
		mod(&c3, &v3)
		if got := kvWait(in, &c3, v3, 4000); got != 0 {
			t.Errorf("%s: wait %v, want 0", name, got)
		}
	}
}

// TestKVWaitLearnsTheDecodeTime: one request picked at t0 gets its first token at 1 s;
// at 6 s, still decoding, the worker's decode time is at least 5 s (censored); after it
// completes at 11 s the decode time is its 10 s. The queue term of a KV-full worker is
// then the KV wait: 16,000 held + 4,000 needed − 16,000 = 4,000 tokens, 10 s × ¼ = 2.5 s,
// far above the 4,000 tokens' prefill; with KVWait off the queue term stays the prefill
// rate's.
func TestKVWaitLearnsTheDecodeTime(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(1), CongestionMax: -1, KVWait: true}, false)
	off := NewPredictor(Options{Rand: seeded(1), CongestionMax: -1}, false)
	c := kvFull("w", 1, 0)
	for _, pp := range []*Predictor{p, off} {
		if d := pp.Pick(input(1000), []Candidate{c}); d.Index != 0 {
			t.Fatal(d)
		}
		pp.Observe(Observation{Worker: "w", PromptTokens: 1000, Start: t0, TTFT: time.Second})
	}
	in := input(4000)
	in.Now = t0.Add(6 * time.Second)
	c.Booked.Decoding = 1
	if got := p.Predict(in, &c).Features[TermQueue]; math.Abs(got-5*4000.0/16000) > 1e-9 {
		t.Fatalf("censored decode 5 s: queue term %v s, want 1.25", got)
	}
	for _, pp := range []*Predictor{p, off} {
		pp.Observe(Observation{Worker: "w", PromptTokens: 1000, Start: t0, TTFT: time.Second, E2E: 11 * time.Second})
	}
	c.Booked.Decoding = 0
	in.Now = t0.Add(20 * time.Second)
	if got := p.Predict(in, &c).Queue; math.Abs(got.Seconds()-2.5) > 1e-6 {
		t.Fatalf("decode 10 s: queue %v, want 2.5 s", got)
	}
	if got := off.Predict(in, &c).Queue; got != 0 {
		t.Fatalf("KVWait off: queue %v, want 0 (nothing queued)", got)
	}
	// A further completion moves the EWMA by a tenth: 10 + 0.1 × (30 − 10) = 12 s.
	p.Observe(Observation{Worker: "w", PromptTokens: 1000, Start: t0, TTFT: time.Second, E2E: 31 * time.Second})
	if got := p.Predict(in, &c).Queue; math.Abs(got.Seconds()-12.0/4) > 1e-6 {
		t.Fatalf("decode EWMA 12 s: queue %v, want 3 s", got)
	}
}
