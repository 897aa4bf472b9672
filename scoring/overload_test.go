package scoring

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/workers"
)

// TestEvictedDuringTheWaitIsNoHit: a 6,000-token prefix cached on a worker whose queue
// ahead (40,000 uncached tokens = 2,500 blocks) writes more than its free blocks
// (10 % of 2,048) is gone when the request is scheduled: the prediction charges the
// whole prefill. With room for the queue's writes the hit stands; with room for part
// of it, the hit keeps what is left.
func TestEvictedDuringTheWaitIsNoHit(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(1), EvictDuringWait: true}, false)
	in := input(6200)
	mk := func(kvUsage float64) Candidate {
		c := cand("hot", 6000, 40000)
		c.Worker.Profile.BlockCapacity = 2048
		c.Load = workers.Load{KVUsage: kvUsage, ScrapedAt: t0}
		return c
	}
	full := p.Predict(in, &Candidate{Worker: &workers.Worker{Name: "cold"}}).Prefill
	if got := p.Predict(in, ptr(mk(0.9))).Prefill; got != full {
		t.Fatalf("queue writes 2,500 blocks > 205 free: prefill %v, want the full %v", got, full)
	}
	c := mk(0.9)
	c.Worker.Profile.BlockCapacity = 0 // capacity unknown: trust the index
	if got := p.Predict(in, &c).Prefill; got >= full/10 {
		t.Fatalf("unknown capacity must keep the hit: prefill %v", got)
	}
	// 2,048·(1−0) − 2,500 < 0 still evicts; a 40,000-block cache keeps it all.
	c = mk(0)
	c.Worker.Profile.BlockCapacity = 40000
	if got := p.Predict(in, &c).Prefill; got >= full/10 {
		t.Fatalf("room for the queue's writes must keep the hit: prefill %v", got)
	}
	// 2,700 free − 2,500 written = 200 blocks = 3,200 of the 6,000 cached tokens left.
	c = mk(0)
	c.Worker.Profile.BlockCapacity = 2700
	if got, want := keptAfterWait(in, &c, 6000, 40000), 3200; got != want {
		t.Fatalf("partial eviction keeps %d tokens, want %d", got, want)
	}
}

// TestEvictionDuringTheWaitIsOptIn: by default the index's hit stands behind any queue
// (the same worker as above, 2,500 blocks written ahead of 205 free): the prefill is
// the 200 uncached tokens' only, 200/6,200 of the cold worker's. The eviction model is
// opt-in because in deep queues of a hot prefix it called every holder's prefix evicted
// (the requests ahead share and re-touch it), routing cache-blind into a runaway.
func TestEvictionDuringTheWaitIsOptIn(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(1)}, false)
	in := input(6200)
	c := cand("hot", 6000, 40000)
	c.Worker.Profile.BlockCapacity = 2048
	c.Load = workers.Load{KVUsage: 0.9, ScrapedAt: t0}
	full := p.Predict(in, &Candidate{Worker: &workers.Worker{Name: "cold"}}).Prefill
	got := p.Predict(in, &c).Prefill
	if want := time.Duration(float64(full) * 200 / 6200); got < want-time.Microsecond || got > want+time.Microsecond {
		t.Fatalf("default: prefill %v, want the uncached 200 tokens' %v (cold %v)", got, want, full)
	}
}

func ptr[T any](v T) *T { return &v }

// TestBacklogDrainsTheHeadOfTheQueue: 40,000 tokens booked at t0 (four picks) on a
// 5,000 tok/s worker; 2 s later 10,000 of them are prefilled, so the queue term is
// 30,000 tokens (6 s), not the bookings' 40,000 (8 s); the bookings are the upper
// bound and the bookings less the head the lower one.
func TestBacklogDrainsTheHeadOfTheQueue(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(1), CongestionMax: -1, QueueBacklog: true}, false)
	c := cand("w", 0, 0)
	for i := 0; i < 4; i++ { // four 10,000-token picks at t0, each booked by "the router"
		d := p.Pick(input(10000), []Candidate{c})
		if d.Index != 0 {
			t.Fatal(d)
		}
		c.Booked.Requests++
		c.Booked.Prefilling++
		c.Booked.PrefillTokens += 10000
	}
	in := input(100)
	in.Now = t0.Add(2 * time.Second)
	if got := p.Predict(in, &c).Features[TermQueue]; math.Abs(got-6) > 1e-6 {
		t.Fatalf("queue after 2 s = %.3f s, want 6 (30,000 tokens left at 5,000 tok/s)", got)
	}
	// 20 s later the recursion says drained, but no first token came: the engine is held
	// up by something else (KV space), and only the head can have started — 30,000
	// tokens remain at least.
	in.Now = t0.Add(20 * time.Second)
	if got := p.Predict(in, &c).Features[TermQueue]; math.Abs(got-6) > 1e-6 {
		t.Fatalf("queue with no first token for 20 s = %.3f s, want 6 (all but the head)", got)
	}
	// The head's first token: 30,000 booked, the next head is 10,000 → at least 20,000.
	p.Observe(Observation{Worker: "w", PromptTokens: 10000, Predicted: p.Predict(input(10000), &c), Start: t0, TTFT: 2 * time.Second})
	c.Booked.Prefilling--
	c.Booked.PrefillTokens -= 10000
	if got := p.Predict(in, &c).Features[TermQueue]; math.Abs(got-4) > 1e-6 {
		t.Fatalf("queue after the head's first token = %.3f s, want 4", got)
	}
	// A fresh predictor (no backlog known), or one with the backlog off (the default),
	// counts the bookings in full.
	if got := NewPredictor(Options{Rand: seeded(1)}, false).Predict(in, &c).Features[TermQueue]; math.Abs(got-6) > 1e-6 {
		t.Fatalf("queue_backlog off = %.3f s, want the bookings' 6", got)
	}
	q := NewPredictor(Options{Rand: seeded(1), QueueBacklog: true}, false)
	if got := q.Predict(in, &c).Features[TermQueue]; math.Abs(got-6) > 1e-6 {
		t.Fatalf("queue without a backlog = %.3f s, want the bookings' 6 (30,000 tokens)", got)
	}
}

// TestLoadedClusterPricesTheWorkAPickAdds: a request whose 12,000-token prefix is
// cached on a worker with a deeper queue. Idle cluster: the other worker is predicted
// faster (recompute 2.4 s vs 2.8 s of queue) and wins. Loaded cluster (offered prefill
// ≈ 90 % of capacity from recent picks): recomputing 12,000 tokens delays the requests
// behind by ρ/(1−ρ) × 2.4 s, so the holder wins. The prediction itself stays the TTFT.
func TestLoadedClusterPricesTheWorkAPickAdds(t *testing.T) {
	in := input(12200)
	holder, other := cand("holder", 12000, 14000), cand("other", 0, 0)
	idle := NewPredictor(Options{Rand: seeded(1)}, false)
	if d := idle.Pick(in, []Candidate{holder, other}); d.Index != 1 {
		t.Fatalf("idle cluster: the faster TTFT must win, got %d %+v", d.Index, d.Predictions)
	}
	// Offer ≈ 0.9 of two workers' 5,000 tok/s over the write window (30 s / ln 2).
	withLoad := func(o Options) *Predictor {
		p := NewPredictor(o, false)
		load := input(int(0.9 * 5000 * windowSeconds(30*time.Second)))
		load.Now = t0.Add(-time.Millisecond)
		for _, w := range []Candidate{cand("holder", 0, 0), cand("other", 0, 0)} {
			p.Pick(load, []Candidate{w})
		}
		return p
	}
	loaded := withLoad(Options{Rand: seeded(1)})
	st := make([]candState, 2)
	cs := []Candidate{holder, other}
	loaded.mu.RLock()
	pool := loaded.poolFactors()
	for i := range cs {
		loaded.predictLocked(in, &cs[i], &st[i], &pool)
	}
	u := loaded.utilLocked(in, cs, st, nil)
	loaded.mu.RUnlock()
	if u < 0.85 || u > 0.95 {
		t.Fatalf("utilization %.3f, want ≈ 0.9", u)
	}
	d := loaded.Pick(in, cs)
	if d.Index != 0 {
		t.Fatalf("loaded cluster: the holder must win, got %d %+v", d.Index, d.Predictions)
	}
	if d.Predictions[1].TTFT >= d.Predictions[0].TTFT {
		t.Fatalf("predictions must stay TTFTs (other faster): %+v", d.Predictions)
	}
	if off := withLoad(Options{Rand: seeded(1), CongestionMax: -1}); off.Pick(in, cs).Index != 1 {
		t.Fatal("congestion_max < 0 must leave the TTFT alone deciding")
	}
}

// TestOursThatLeftAreNotForeign: a scrape at t0 shows 3 waiting requests; all 3 were
// ours and got their first token after it. They are neither booked as prefilling nor
// someone else's, so the queue term holds no foreign work — before, each counted as a
// foreign request of F_w tokens until the next scrape.
func TestOursThatLeftAreNotForeign(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(1)}, true)
	c := cand("w", 0, 0)
	in := input(2000)
	var preds []Prediction
	for i := 0; i < 3; i++ {
		d := p.Pick(in, []Candidate{c})
		preds = append(preds, d.Predictions[0])
	}
	c.Load = workers.Load{Waiting: 3, Running: 3, ScrapedAt: t0}
	for i, pr := range preds {
		p.Observe(Observation{Worker: "w", PromptTokens: 2000, Predicted: pr, Start: t0, TTFT: time.Duration(i+1) * 100 * time.Millisecond})
	}
	in.Now = t0.Add(500 * time.Millisecond)
	if q := p.Predict(in, &c).Features[TermQueue]; q != 0 {
		t.Fatalf("queue %.3f s: our requests that left the queue after the scrape were priced as foreign", q)
	}
	c.Load.Waiting = 5 // two more than ours: those are foreign
	if q := p.Predict(in, &c).Features[TermQueue]; q <= 0 {
		t.Fatalf("waiting requests beyond ours must count, queue %.3f s", q)
	}
}

// TestBacklogFactor: offered ÷ served when the first tokens fall behind the writes, 1
// otherwise (and before anything is served).
func TestBacklogFactor(t *testing.T) {
	for _, c := range []struct{ offered, served, want float64 }{
		{10, 0, 1}, {10, 10, 1}, {5, 10, 1}, {15, 10, 1.5}, {30, 10, 3},
	} {
		if got := backlogFactor(c.offered, c.served); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("backlogFactor(%g, %g) = %g, want %g", c.offered, c.served, got, c.want)
		}
	}
}

// TestUtilizationCountsTheBacklog: two workers were each routed 0.45 of their prefill
// capacity over the write window (5,000 tok/s each, 30 s / ln 2), so the model's
// utilization is 0.45. While only one of the two requests has had its first token, the
// writes run twice ahead of what was served: ρ doubles to 0.9 (κ from 0.82 to 8, the
// cap). Once both are served it is 0.45 again; a non-streamed request counts as served
// at its completion (reported once, TTFT 0).
// Off (the default, Options.UtilizationBacklog false) ρ stays the model's 0.45.
func TestUtilizationCountsTheBacklog(t *testing.T) {
	for _, on := range []bool{true, false} {
		checkUtilizationBacklog(t, on)
	}
}

func checkUtilizationBacklog(t *testing.T, on bool) {
	p := NewPredictor(Options{Rand: seeded(1), UtilizationBacklog: on}, false)
	n := int(0.45 * 5000 * windowSeconds(30*time.Second))
	start := t0.Add(-time.Millisecond)
	load := input(n)
	load.Now = start
	for _, w := range []Candidate{cand("a", 0, 0), cand("b", 0, 0)} {
		p.Pick(load, []Candidate{w})
	}
	cs := []Candidate{cand("a", 0, 0), cand("b", 0, 0)}
	util := func() float64 {
		in := input(1000)
		st := make([]candState, len(cs))
		p.mu.RLock()
		defer p.mu.RUnlock()
		pool := p.poolFactors()
		for i := range cs {
			p.predictLocked(in, &cs[i], &st[i], &pool)
		}
		return p.utilLocked(in, cs, st, nil)
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 0.01 {
			t.Fatalf("%s: utilization %.4f, want %.2f", what, got, want)
		}
	}
	near("nothing served yet", util(), 0.45)
	p.Observe(Observation{Worker: "a", PromptTokens: n, Start: start, TTFT: time.Millisecond})
	if !on {
		near("a served, b not, backlog factor off", util(), 0.45)
		return
	}
	near("a served, b not", util(), 0.90)
	if k := congestion(&p.o, util()); k != 8 {
		t.Fatalf("congestion at ρ = 0.9 is 9, capped at 8; got %g", k)
	}
	p.Observe(Observation{Worker: "b", PromptTokens: n, Start: start, E2E: 2 * time.Millisecond})
	near("both served (b not streamed)", util(), 0.45)
}
