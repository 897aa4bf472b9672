package router

import (
	"context"
	"math"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"

	"github.com/kvroute/kvroute/kvindex"
)

// alternatePolicy picks candidate 0, then 1, then 0, ...
type alternatePolicy struct{ n atomic.Int64 }

func (*alternatePolicy) Name() string { return "alternate" }
func (p *alternatePolicy) Pick(_ *scoring.Input, c []scoring.Candidate) scoring.Decision {
	return scoring.Decision{Index: int(p.n.Add(1)-1) % len(c), Reason: "alternate"}
}

// The same new prefix prefilling on two workers at once is reported for both: the
// keys of LocalBookings are deduplicated per worker (a set shared across workers
// reported it only for the first, and peers then routed to that one alone).
func TestLocalBookingsReportsKeysPerWorker(t *testing.T) {
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "w0", Address: "10.0.0.1:8000", Models: []string{"m"}},
		{Name: "w1", Address: "10.0.0.2:8000", Models: []string{"m"}}})
	ix := kvindex.New(kvindex.Options{SpeculativeTTL: time.Hour})
	r := New(Options{Registry: reg, Index: ix, Policy: &alternatePolicy{}, Metrics: metrics.NewUnregistered(),
		Models: []Model{{Name: "m", BlockSize: 16}}})
	ctx := context.Background()
	var tks []*Ticket
	for range 2 {
		tk, err := r.Pick(ctx, promptOf(160, 7), PickOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer tk.Done(200, response.Usage{}, time.Time{})
		tks = append(tks, tk)
	}
	if tks[0].Worker == tks[1].Worker {
		t.Fatalf("both on %s, want one per worker", tks[0].Worker)
	}
	got := map[string]int{}
	for _, wb := range r.LocalBookings(100) {
		got[wb.Worker] = len(wb.Keys)
		if wb.Booked.Prefilling != 1 || wb.OldestPrefill.IsZero() {
			t.Errorf("%s: booked %+v oldest %v, want 1 prefilling with its start", wb.Worker, wb.Booked, wb.OldestPrefill)
		}
	}
	// 160 tokens = 10 blocks; the last token is recomputed, so 9 or 10 keys are booked.
	if got["w0"] == 0 || got["w0"] != got["w1"] {
		t.Fatalf("keys per worker %v, want the same prefix reported on both", got)
	}
	if w := r.LocalBookings(3); len(w) != 2 || len(w[0].Keys) != 3 || len(w[1].Keys) != 3 {
		t.Fatalf("maxKeys 3: %+v, want 3 keys on each worker", w)
	}
}

// LocalBookings reports the times requests left the queue and the running set, and
// the policy's decayed writes; SetPeerBookings turns a peer's into the candidate's
// PeerLeft (times after its scrape) and PeerWrites (decayed to the pick).
func TestPeerLeftAndWrites(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "w0", Address: "10.0.0.1:8000", Models: []string{"m"}}})
	pol := scoring.NewPredictor(scoring.Options{WriteHalfLife: 10 * time.Second, ExploreFraction: -1}, false)
	r := New(Options{Registry: reg, Index: kvindex.New(kvindex.Options{}), Policy: pol, Metrics: metrics.NewUnregistered(),
		Models: []Model{{Name: "m", BlockSize: 16}}, Now: func() time.Time { return now }})
	ctx := context.Background()
	a, err := r.Pick(ctx, promptOf(160, 1), PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.Pick(ctx, promptOf(160, 2), PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a.FirstToken(t0.Add(time.Second))
	b.FirstToken(t0.Add(2 * time.Second))
	now = t0.Add(3 * time.Second)
	b.Done(200, response.Usage{}, now)
	lb := r.LocalBookings(0)
	if len(lb) != 1 {
		t.Fatalf("LocalBookings: %+v, want w0", lb)
	}
	w := lb[0]
	if want := []time.Time{t0.Add(time.Second), t0.Add(2 * time.Second)}; !reflect.DeepEqual(w.FirstTokens, want) {
		t.Errorf("FirstTokens %v, want %v", w.FirstTokens, want)
	}
	if want := []time.Time{now}; !reflect.DeepEqual(w.Finished, want) {
		t.Errorf("Finished %v, want %v", w.Finished, want)
	}
	// 2 × 160 uncached tokens at t0, 3 s old at a 10 s half-life.
	if want := 320 * math.Exp2(-0.3); math.Abs(w.Writes-want) > 1e-6 || !w.WritesAt.Equal(now) {
		t.Errorf("Writes %v at %v, want %v at %v", w.Writes, w.WritesAt, want, now)
	}
	// Older than LeftWindow: no longer reported; the writes keep the worker listed.
	a.Done(200, response.Usage{}, now)
	now = t0.Add(LeftWindow + 4*time.Second)
	if lb := r.LocalBookings(0); len(lb) != 1 || lb[0].FirstTokens != nil || lb[0].Finished != nil || lb[0].Writes < 1 {
		t.Errorf("after LeftWindow: %+v, want w0 with its writes only", lb)
	}

	// The receiving side: a peer's times after the scrape count, those before do not.
	reg.SetLoad("w0", workers.Load{Waiting: 3, ScrapedAt: t0.Add(1500 * time.Millisecond)})
	r.SetPeerBookings(map[string]PeerWorker{"w0": {Booked: scoring.Booked{Requests: 1, Decoding: 1},
		FirstTokens: []time.Time{t0.Add(time.Second), t0.Add(2 * time.Second), t0.Add(3 * time.Second)},
		Finished:    []time.Time{t0, t0.Add(2 * time.Second)},
		Writes:      []PeerWrites{{Tokens: 1000, At: now.Add(-10 * time.Second)}, {Tokens: 500, At: now}}}})
	ex, err := r.Explain(ctx, promptOf(160, 3), PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := ex.Candidates[0]
	if c.PeerLeft != (scoring.Left{Waiting: 2, Running: 1}) || c.Booked.Decoding != 1 {
		t.Errorf("PeerLeft %+v booked %+v, want 2 waiting and 1 running left, 1 decoding", c.PeerLeft, c.Booked)
	}
	if math.Abs(c.PeerWrites-1000) > 1e-6 { // 1000 × ½ + 500
		t.Errorf("PeerWrites %v, want 1000", c.PeerWrites)
	}
}

// Replicas that put the same new prefix on one worker before either's summary reached
// the other each booked its prefill in full; the engine computes those blocks once. A
// receiver counts the peers' reported keys that its own prefilling requests there (or
// a peer merged before) also created as DuplicateBlocks, and a pick sees the peers'
// prefill tokens less those blocks; keys of another prefix, or on another worker, are
// not discounted.
func TestPeerDuplicatePrefillCountedOnce(t *testing.T) {
	newReplica := func() *Router {
		reg := workers.NewRegistry()
		reg.Set([]*workers.Worker{{Name: "w0", Address: "10.0.0.1:8000", Models: []string{"m"}},
			{Name: "w1", Address: "10.0.0.2:8000", Models: []string{"m"}}})
		ix := kvindex.New(kvindex.Options{SpeculativeTTL: time.Hour})
		return New(Options{Registry: reg, Index: ix, Policy: &alternatePolicy{}, Metrics: metrics.NewUnregistered(),
			Models: []Model{{Name: "m", BlockSize: 16}}})
	}
	ctx := context.Background()
	pick := func(r *Router, req *request.Request, worker string) *Ticket {
		t.Helper()
		tk, err := r.Pick(ctx, req, PickOptions{SubsetHint: true, Subset: []string{map[string]string{"w0": "10.0.0.1:8000", "w1": "10.0.0.2:8000"}[worker]}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tk.Done(200, response.Usage{}, time.Time{}) })
		if tk.Worker != worker {
			t.Fatalf("picked %s, want %s", tk.Worker, worker)
		}
		return tk
	}
	a, b, c := newReplica(), newReplica(), newReplica()
	prefix := promptOf(160, 7) // 10 blocks, each booked as a speculative entry
	pick(a, prefix, "w0")
	pick(b, prefix, "w0") // blind to a: a second cold prefill of the same blocks
	pick(c, prefix, "w0")
	pick(b, promptOf(160, 8), "w1") // another prefix on another worker
	report := func(from *Router) map[string]WorkerBookings {
		out := map[string]WorkerBookings{}
		for _, wb := range from.LocalBookings(1000) {
			out[wb.Worker] = wb
		}
		return out
	}
	rb, rc := report(b), report(c)
	n := len(rb["w0"].Keys)
	if n < 9 || n != len(rc["w0"].Keys) || rb["w0"].Booked.PrefillTokens != 160 {
		t.Fatalf("b reports w0 %+v keys %d (c %d), want 160 prefill tokens and the prefix's 9–10 blocks from both", rb["w0"].Booked, n, len(rc["w0"].Keys))
	}
	booked := func(r *Router, worker string) scoring.Booked {
		t.Helper()
		ex, err := r.Explain(ctx, promptOf(64, 9), PickOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, cd := range ex.Candidates {
			if cd.Worker.Name == worker {
				return cd.Booked
			}
		}
		t.Fatalf("no candidate %s", worker)
		return scoring.Booked{}
	}
	// a hears b: b's 9 blocks on w0 are a's own in-flight ones; w1 is b's alone
	m := map[string]PeerWorker{}
	for name, wb := range rb {
		p := m[name]
		p.Add(wb.Booked, nil, nil, PeerWrites{}, wb.Keys)
		m[name] = p
	}
	a.SetPeerBookings(m)
	if got := a.PeerBookings()["w0"].DuplicateBlocks; got != n {
		t.Errorf("w0 duplicate blocks %d, want %d", got, n)
	}
	if got := booked(a, "w0"); got.PrefillTokens != 2*160-n*16 || got.Prefilling != 2 || got.Requests != 2 {
		t.Errorf("a's view of w0 %+v, want 2 prefilling, %d prefill tokens (b's blocks are a's)", got, 2*160-n*16)
	}
	if got := booked(a, "w1"); got.PrefillTokens != 160 || a.PeerBookings()["w1"].DuplicateBlocks != 0 {
		t.Errorf("a's view of w1 %+v, want b's 160 prefill tokens in full", got)
	}
	// a hears b and c: c's copy duplicates b's too (counted against the merged one)
	m = map[string]PeerWorker{}
	for _, rep := range []map[string]WorkerBookings{rb, rc} {
		for name, wb := range rep {
			p := m[name]
			p.Add(wb.Booked, nil, nil, PeerWrites{}, wb.Keys)
			m[name] = p
		}
	}
	a.SetPeerBookings(m)
	if got := a.PeerBookings()["w0"].DuplicateBlocks; got != 2*n {
		t.Errorf("w0 duplicate blocks with two peers %d, want %d", got, 2*n)
	}
	if got := booked(a, "w0"); got.PrefillTokens != 3*160-2*n*16 {
		t.Errorf("a's view of w0 with two peers %+v, want %d prefill tokens", got, 3*160-2*n*16)
	}
	// a fresh replica with nothing of its own hears b and c: one copy is b's, c's repeats it
	d := newReplica()
	d.SetPeerBookings(m)
	if got := booked(d, "w0"); got.PrefillTokens != 2*160-n*16 {
		t.Errorf("d's view of w0 %+v, want %d prefill tokens", got, 2*160-n*16)
	}
}
