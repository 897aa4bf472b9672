package scoring

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/workers"
)

func TestModelTermsBehave(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(1)}, true)
	in := input(4096)
	pred := func(c Candidate) Prediction { return p.Predict(in, &c) }

	cold, warm, hot := pred(cand("a", 0, 0)), pred(cand("a", 2048, 0)), pred(cand("a", 4080, 0))
	if !(cold.TTFT > warm.TTFT && warm.TTFT > hot.TTFT) {
		t.Fatalf("more cached tokens must lower the prediction: cold %v warm %v hot %v", cold.TTFT, warm.TTFT, hot.TTFT)
	}
	if want := time.Duration(4096.0 / 5000 * float64(time.Second)); absDur(cold.Prefill-want) > time.Microsecond {
		t.Fatalf("cold prefill = %v, want uncached/prior rate = %v", cold.Prefill, want)
	}
	if cold.Overhead != 20*time.Millisecond || cold.Queue != 0 {
		t.Fatalf("idle worker: overhead %v (want 20ms prior) queue %v (want 0)", cold.Overhead, cold.Queue)
	}

	idle, busy, busier := pred(cand("a", 0, 0)), pred(cand("a", 0, 5000)), pred(cand("a", 0, 20000))
	if !(idle.TTFT < busy.TTFT && busy.TTFT < busier.TTFT) {
		t.Fatalf("more queued prefill must raise the prediction: %v %v %v", idle.TTFT, busy.TTFT, busier.TTFT)
	}
	if busy.Queue != time.Second {
		t.Fatalf("5000 booked tokens at 5000 tok/s must queue 1s, got %v", busy.Queue)
	}

	// Decode interference: running sequences lengthen the wait.
	dec := cand("a", 0, 0)
	dec.Booked = Booked{Requests: 50, Decoding: 50}
	if d := pred(dec); d.Queue <= 0 || d.TTFT <= idle.TTFT {
		t.Fatalf("50 running decodes must add queue time, got %+v", d)
	}
}

func TestLowerTierHitCostsTransferNotZero(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(1)}, true)
	in := input(4096)
	gpu := cand("a", 4080, 0)
	cpu := gpu
	cpu.Cached.ByTier = [kvindex.NumTiers]int{}
	cpu.Cached.ByTier[kvindex.TierCPU] = cpu.Cached.Blocks
	disk := gpu
	disk.Cached.ByTier = [kvindex.NumTiers]int{}
	disk.Cached.ByTier[kvindex.TierDisk] = disk.Cached.Blocks
	cold := cand("a", 0, 0)
	g, c, d, n := p.Predict(in, &gpu), p.Predict(in, &cpu), p.Predict(in, &disk), p.Predict(in, &cold)
	if !(g.TTFT < c.TTFT && c.TTFT < d.TTFT && d.TTFT < n.TTFT) {
		t.Fatalf("want GPU hit < CPU hit < disk hit < recompute, got %v %v %v %v", g.TTFT, c.TTFT, d.TTFT, n.TTFT)
	}
}

func TestScrapedLoadStalenessAndNoDoubleCount(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(1), ForeignRequestTokens: 1000}, true)
	in := input(100)
	fresh := cand("a", 0, 0)
	fresh.Load = workers.Load{Waiting: 10, ScrapedAt: t0}
	old := fresh
	old.Load.ScrapedAt = t0.Add(-4 * time.Second) // two half-lives
	fq, oq := p.Predict(in, &fresh).Queue, p.Predict(in, &old).Queue
	if fq != 2*time.Second { // 10 foreign × 1000 tokens / 5000 tok/s
		t.Fatalf("fresh scrape: queue %v, want 2s", fq)
	}
	if absDur(oq-fq/4) > time.Millisecond {
		t.Fatalf("a scrape two half-lives old must count 1/4: %v vs fresh %v", oq, fq)
	}
	never := cand("a", 0, 0)
	never.Load = workers.Load{Waiting: 10}
	if q := p.Predict(in, &never).Queue; q != 0 {
		t.Fatalf("never-scraped load must not count, got %v", q)
	}
	// 10 waiting, all of them ours (booked): the scraped count adds nothing.
	ours := cand("a", 0, 0)
	ours.Load = workers.Load{Waiting: 10, ScrapedAt: t0}
	ours.Booked = Booked{Requests: 10, Prefilling: 10, PrefillTokens: 3000}
	if q := p.Predict(in, &ours).Queue; q != 600*time.Millisecond {
		t.Fatalf("bookings already in the scraped queue must not be counted twice: queue %v, want 600ms", q)
	}
	// Disabled scraped load.
	p2 := NewPredictor(Options{Rand: seeded(1), LoadHalfLife: -1}, true)
	if q := p2.Predict(in, &fresh).Queue; q != 0 {
		t.Fatalf("LoadHalfLife<0 must ignore scraped load, got %v", q)
	}
}

func TestProfilePriorAndHeterogeneousPrior(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(1)}, true)
	in := input(10000)
	fast := cand("fast", 0, 0)
	fast.Worker.Profile = workers.Profile{PrefillTokensPerSecond: 20000, Overhead: 5 * time.Millisecond}
	slow := cand("slow", 0, 0)
	d := p.Pick(in, []Candidate{slow, fast})
	if d.Index != 1 {
		t.Fatalf("a faster profile must win on an equal cold prompt: %+v", d)
	}
	if got := d.Predictions[1].Prefill; got != 500*time.Millisecond {
		t.Fatalf("profile prefill rate: got %v want 500ms", got)
	}
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// Peer replicas' requests that left the worker after its scrape (Candidate.PeerLeft)
// are neither booked nor foreign with Options.PeerState; without it they count as
// foreign waiting requests at F_w each.
func TestPeerLeftNotForeign(t *testing.T) {
	in := input(100)
	c := cand("a", 0, 0)
	c.Load = workers.Load{Waiting: 10, ScrapedAt: t0}
	c.PeerLeft = Left{Waiting: 4}
	off := NewPredictor(Options{Rand: seeded(1), ForeignRequestTokens: 1000}, true)
	if q := off.Predict(in, &c).Queue; q != 2*time.Second { // 10 × 1000 tokens / 5000 tok/s
		t.Fatalf("PeerState off: queue %v, want 2s", q)
	}
	on := NewPredictor(Options{Rand: seeded(1), ForeignRequestTokens: 1000, PeerState: true}, true)
	if q := on.Predict(in, &c).Queue; q != 1200*time.Millisecond { // 6 foreign left
		t.Fatalf("PeerState on: queue %v, want 1.2s (4 of 10 left)", q)
	}
}

// Peer writes join the write tie-break with Options.PeerState: of two tied idle
// workers, the one peers wrote less to wins; Writes reports the own writes alone.
func TestPeerWritesBreakTies(t *testing.T) {
	in := input(100)
	a, b := cand("a", 0, 0), cand("b", 0, 0)
	a.PeerWrites = 50000
	on := NewPredictor(Options{Rand: seeded(1), PeerState: true, ExploreFraction: -1}, true)
	if d := on.Pick(in, []Candidate{a, b}); d.Index != 1 {
		t.Fatalf("PeerState on: picked %d, want 1 (fewer peer writes)", d.Index)
	}
	if w := on.Writes("b", t0); w != 100 {
		t.Fatalf("own writes to b after the pick: %v, want 100 (uncached tokens)", w)
	}
	if w := on.Writes("a", t0); w != 0 {
		t.Fatalf("own writes to a: %v, want 0", w)
	}
}

// Extreme inputs in every term (a peer's claim of 2^39 bookings, a scrape gone wild, a
// huge prompt) saturate the prediction: finite, positive, never an int64 overflow that
// turns a huge delay negative and draws every request to that worker.
func TestPredictionSaturates(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(1)}, true)
	const huge = 1 << 39
	normal := p.Predict(input(4096), ptr(cand("b", 0, 5000)))
	for name, mod := range map[string]func(in *Input, c *Candidate){
		"prompt": func(in *Input, c *Candidate) { in.PromptTokens = huge },
		"booked prefill": func(in *Input, c *Candidate) {
			c.Booked = Booked{Requests: huge, Prefilling: huge, PrefillTokens: huge}
		},
		"booked decode": func(in *Input, c *Candidate) { c.Booked = Booked{Requests: huge, Decoding: huge} },
		"unsized":       func(in *Input, c *Candidate) { c.Booked = Booked{Requests: huge, Prefilling: huge, Unsized: huge} },
		"scraped load": func(in *Input, c *Candidate) {
			c.Load = workers.Load{Waiting: 1e300, Running: 1e300, ScrapedAt: in.Now}
		},
		"everything": func(in *Input, c *Candidate) {
			in.PromptTokens = huge
			c.Booked = Booked{Requests: huge, Prefilling: huge, PrefillTokens: huge, Decoding: huge, Unsized: huge}
			c.Load = workers.Load{Waiting: 1e300, Running: 1e300, ScrapedAt: in.Now}
		},
	} {
		in, c := input(4096), cand("a", 0, 0)
		mod(in, &c)
		got := p.Predict(in, &c)
		if got.TTFT <= normal.TTFT || got.TTFT > 3*MaxPredictedTerm || got.Queue < 0 || got.Prefill < 0 {
			t.Errorf("%s: TTFT %v (queue %v prefill %v): want above a normal worker's %v and at most 3 × %v",
				name, got.TTFT, got.Queue, got.Prefill, normal.TTFT, MaxPredictedTerm)
		}
	}
}
