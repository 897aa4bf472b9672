package router

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/jsonvalue"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// clock is an injected clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// learner records observations (and picks like Simple).
type learner struct {
	scoring.Simple
	mu  sync.Mutex
	obs []scoring.Observation
}

func (l *learner) Observe(o scoring.Observation) {
	l.mu.Lock()
	l.obs = append(l.obs, o)
	l.mu.Unlock()
}

type fixture struct {
	reg *workers.Registry
	r   *Router
	clk *clock
	ms  *metrics.Set
	pol *learner
}

// newFixture: n workers w0..w{n-1} serving model "m", an injected clock, a learning policy.
func newFixture(t testing.TB, n int, ttl time.Duration) *fixture {
	f := &fixture{reg: workers.NewRegistry(), clk: &clock{t: time.Unix(1_700_000_000, 0)}, ms: metrics.NewUnregistered(), pol: &learner{}}
	var ws []*workers.Worker
	for i := 0; i < n; i++ {
		ws = append(ws, &workers.Worker{Name: fmt.Sprintf("w%d", i), Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Models: []string{"m"}})
	}
	f.reg.Set(ws)
	f.r = New(Options{Registry: f.reg, Models: []Model{{Name: "m"}}, Policy: f.pol, TicketTTL: ttl, Metrics: f.ms, Now: f.clk.now})
	return f
}

var chat = &request.Request{API: request.APIChat, Model: "m", Messages: jsonvalue.MessagesOf([]map[string]any{{"role": "user", "content": "x"}})}

func (f *fixture) booked(name string) scoring.Booked {
	ws, _ := f.r.Snapshot()
	for _, w := range ws {
		if w.Name == name {
			return w.Booked
		}
	}
	return scoring.Booked{}
}

// Pick books under the lock that made the choice: 100 concurrent identical picks
// see each other and spread evenly over 4 workers.
func TestBurstBookedUnderLock(t *testing.T) {
	f := newFixture(t, 4, time.Minute)
	var wg sync.WaitGroup
	per := make(chan string, 100)
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk, err := f.r.Pick(context.Background(), chat, PickOptions{})
			if err != nil {
				t.Error(err)
				return
			}
			per <- tk.Worker
		}()
	}
	wg.Wait()
	close(per)
	count := map[string]int{}
	for w := range per {
		count[w]++
	}
	for i := 0; i < 4; i++ {
		name := fmt.Sprintf("w%d", i)
		if count[name] != 25 || f.booked(name).Requests != 25 || f.booked(name).Prefilling != 25 {
			t.Fatalf("spread %v, booked %+v", count, f.booked(name))
		}
	}
	if f.r.InFlight() != 100 {
		t.Fatalf("in flight %d", f.r.InFlight())
	}
}

// FirstToken, Done and Abort may be called in any order, any number of times: only
// the first Done/Abort counts; FirstToken after either is ignored.
func TestTicketIdempotence(t *testing.T) {
	f := newFixture(t, 1, time.Minute)
	tk, err := f.r.Pick(context.Background(), chat, PickOptions{RequestID: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	if tk.RequestID != "r1" || tk.Address != "10.0.0.1:8000" {
		t.Fatalf("%+v", tk)
	}
	f.clk.add(300 * time.Millisecond)
	tk.FirstToken(time.Time{})
	tk.FirstToken(time.Time{})
	if b := f.booked("w0"); b.Prefilling != 0 || b.Decoding != 1 || b.Requests != 1 {
		t.Fatalf("after first token: %+v", b)
	}
	f.clk.add(time.Second)
	tk.Done(200, response.Usage{PromptTokens: 5, CompletionTokens: 2, Present: true}, time.Time{})
	tk.Done(200, response.Usage{}, time.Time{})
	tk.Abort()
	tk.FirstToken(time.Time{})
	if b := f.booked("w0"); b != (scoring.Booked{}) {
		t.Fatalf("after done: %+v", b)
	}
	rel := f.ms.Router.TicketsReleased
	if testutil.ToFloat64(rel.WithLabelValues("first_token")) != 1 || testutil.ToFloat64(rel.WithLabelValues("done")) != 1 || testutil.ToFloat64(rel.WithLabelValues("abort")) != 0 {
		t.Fatal("each release must count once")
	}
	f.pol.mu.Lock()
	defer f.pol.mu.Unlock()
	if len(f.pol.obs) != 2 || f.pol.obs[0].TTFT != 300*time.Millisecond || f.pol.obs[1].TTFT != 300*time.Millisecond ||
		f.pol.obs[1].E2E != 1300*time.Millisecond || f.pol.obs[1].Status != 200 || f.pol.obs[1].Usage.CompletionTokens != 2 {
		t.Fatalf("observations %+v", f.pol.obs)
	}

	// Abort first: later Done and FirstToken change nothing and teach nothing.
	tk2, _ := f.r.Pick(context.Background(), chat, PickOptions{})
	tk2.Abort()
	tk2.Abort()
	tk2.Done(200, response.Usage{}, time.Time{})
	tk2.FirstToken(time.Time{})
	if b := f.booked("w0"); b != (scoring.Booked{}) || len(f.pol.obs) != 2 {
		t.Fatalf("after abort: %+v, %d observations", b, len(f.pol.obs))
	}
}

// The sweep releases tickets older than TicketTTL (injected clock) and counts them.
func TestSweepExpiry(t *testing.T) {
	f := newFixture(t, 2, 10*time.Second)
	old, _ := f.r.Pick(context.Background(), chat, PickOptions{RequestID: "old"})
	f.clk.add(6 * time.Second)
	young, _ := f.r.Pick(context.Background(), chat, PickOptions{RequestID: "young"})
	_, ts := f.r.Snapshot()
	if len(ts) != 2 || ts[0].RequestID != "old" || ts[0].Age != 6*time.Second {
		t.Fatalf("snapshot must list oldest first: %+v", ts)
	}
	if n := f.r.Sweep(); n != 0 {
		t.Fatalf("nothing is older than the TTL yet, swept %d", n)
	}
	f.clk.add(5 * time.Second)
	if n := f.r.Sweep(); n != 1 || f.r.InFlight() != 1 {
		t.Fatalf("swept %d, in flight %d", n, f.r.InFlight())
	}
	old.Done(200, response.Usage{}, time.Time{}) // late completion: no double release
	if b := f.booked(old.Worker); b.Requests < 0 || b.Prefilling < 0 {
		t.Fatalf("double release: %+v", b)
	}
	young.Done(200, response.Usage{}, time.Time{})
	if f.r.InFlight() != 0 || testutil.ToFloat64(f.ms.Router.TicketsReleased.WithLabelValues("expired")) != 1 {
		t.Fatal("expired must count once")
	}
}

// Run sweeps until its context ends.
func TestRunStops(t *testing.T) {
	f := newFixture(t, 1, time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.r.Run(ctx); close(done) }()
	cancel()
	<-done
}

// Removing a worker releases its tickets and forgets its bookings.
func TestWorkerRemoval(t *testing.T) {
	f := newFixture(t, 2, time.Minute)
	var on0 []*Ticket
	for i := 0; i < 4; i++ {
		tk, _ := f.r.Pick(context.Background(), chat, PickOptions{})
		if tk.Worker == "w0" {
			on0 = append(on0, tk)
		}
	}
	all, _ := f.reg.Get("w1")
	f.reg.Set([]*workers.Worker{all})
	if f.r.InFlight() != 2 || len(on0) != 2 {
		t.Fatalf("in flight %d after removing w0 (had %d there)", f.r.InFlight(), len(on0))
	}
	for _, tk := range on0 {
		tk.Done(200, response.Usage{}, time.Time{})
	}
	if testutil.ToFloat64(f.ms.Router.TicketsReleased.WithLabelValues("worker_removed")) != 2 {
		t.Fatal("worker_removed must count 2")
	}
	if f.booked("w1").Requests != 2 {
		t.Fatalf("w1 bookings untouched: %+v", f.booked("w1"))
	}
}

type shed struct{ retry time.Duration }

func (shed) Name() string { return "shed" }
func (s shed) Pick(*scoring.Input, []scoring.Candidate) scoring.Decision {
	return scoring.Decision{Index: -1, Shed: true, RetryAfter: s.retry}
}

func TestPickErrors(t *testing.T) {
	f := newFixture(t, 2, time.Minute)
	_, err := f.r.Pick(context.Background(), &request.Request{API: request.APIChat, Model: "nope"}, PickOptions{})
	var re *Error
	if !errors.As(err, &re) || re.Status != http.StatusNotFound {
		t.Fatalf("unknown model: %v", err)
	}
	f.reg.SetHealthy("w0", false)
	f.reg.SetHealthy("w1", false)
	if _, err := f.r.Pick(context.Background(), chat, PickOptions{}); !errors.As(err, &re) || re.Status != 503 {
		t.Fatalf("no healthy worker: %v", err)
	}
	empty := New(Options{Registry: workers.NewRegistry()})
	if _, err := empty.Pick(context.Background(), &request.Request{API: request.APIOther}, PickOptions{}); !errors.As(err, &re) || re.Status != 503 {
		t.Fatalf("no workers configured: %v", err)
	}
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "a", Address: "10.0.0.9:1", Models: []string{"m"}}})
	sh := New(Options{Registry: reg, Policy: shed{}})
	if _, err := sh.Pick(context.Background(), chat, PickOptions{}); !errors.As(err, &re) || re.Status != 429 || re.RetryAfter != time.Second {
		t.Fatalf("shed: %v", err)
	}
	if sh.InFlight() != 0 {
		t.Fatal("a shed request must not book")
	}
}
