package workers

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvroute/kvroute/metrics"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// vllmMetrics is a trimmed vLLM v1 /metrics body: two data-parallel engines.
const vllmMetrics = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
vllm:num_requests_running{engine="1",model_name="qwen"} 5.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 2.0
vllm:num_requests_waiting{engine="1",model_name="qwen"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="qwen"} 0.75
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="qwen"} 12345.0
`

func TestParseLoad(t *testing.T) {
	l, err := ParseLoad(strings.NewReader(vllmMetrics))
	if err != nil {
		t.Fatal(err)
	}
	if l.Waiting != 3 || l.Running != 8 || l.KVUsage != 0.5 {
		t.Fatalf("waiting/running are summed over engines, KV usage averaged: got %+v", l)
	}
	old := "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.4\nvllm:num_requests_waiting{model_name=\"m\"} 7\n"
	if l, err := ParseLoad(strings.NewReader(old)); err != nil || l.KVUsage != 0.4 || l.Waiting != 7 {
		t.Fatalf("older vllm:gpu_cache_usage_perc must be accepted: %+v %v", l, err)
	}
	if _, err := ParseLoad(strings.NewReader("go_goroutines 5\n")); !errors.Is(err, ErrNoVLLMSeries) {
		t.Fatalf("non-vLLM endpoint: err = %v, want ErrNoVLLMSeries", err)
	}
	if _, err := ParseLoad(strings.NewReader("vllm:num_requests_waiting{ 1\n")); !errors.Is(err, ErrScrapeParse) {
		t.Fatalf("malformed text: err = %v, want ErrScrapeParse", err)
	}
}

// fakeVLLM serves /metrics with a switchable status.
type fakeVLLM struct {
	srv    *httptest.Server
	status atomic.Int32
	body   atomic.Value
	hits   atomic.Int32
}

func newFakeVLLM(t *testing.T) *fakeVLLM {
	f := &fakeVLLM{}
	f.status.Store(200)
	f.body.Store(vllmMetrics)
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.hits.Add(1)
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(int(f.status.Load()))
		w.Write([]byte(f.body.Load().(string)))
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeVLLM) addr() string { return strings.TrimPrefix(f.srv.URL, "http://") }

func TestScraperRecordsLoadAndHealth(t *testing.T) {
	good, bad := newFakeVLLM(t), newFakeVLLM(t)
	bad.status.Store(500)
	reg := NewRegistry()
	reg.Set([]*Worker{{Name: "good", Address: good.addr()}, {Name: "bad", Address: bad.addr()}})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := metrics.NewUnregistered().Scoring
	s := NewScraper(reg, ScrapeOptions{FailuresBeforeUnhealthy: 2, Now: func() time.Time { return now }, Metrics: ms})
	ctx := context.Background()

	s.ScrapeOnce(ctx)
	if l := reg.Load("good"); l.Waiting != 3 || l.Running != 8 || !l.ScrapedAt.Equal(now) {
		t.Fatalf("scraped load not recorded with ScrapedAt: %+v", l)
	}
	if !reg.Healthy("bad") {
		t.Fatal("one failure must not mark a worker unhealthy (threshold 2)")
	}
	s.ScrapeOnce(ctx)
	if reg.Healthy("bad") {
		t.Fatal("two consecutive failures must mark the worker unhealthy")
	}
	if got := testutil.ToFloat64(ms.ScrapeErrors.WithLabelValues("bad", "status")); got != 2 {
		t.Fatalf("status errors counted %v, want 2", got)
	}
	if ws, _ := reg.Candidates("", nil); len(ws) != 1 || ws[0].Name != "good" {
		t.Fatalf("an unhealthy worker must not be a candidate: %v", ws)
	}
	bad.status.Store(200)
	s.ScrapeOnce(ctx)
	if !reg.Healthy("bad") || reg.Load("bad").Waiting != 3 {
		t.Fatal("one successful scrape must mark the worker healthy again and record its load")
	}
	// A parse failure and a refused connection count too.
	bad.body.Store("not metrics {{{")
	s.ScrapeOnce(ctx)
	if got := testutil.ToFloat64(ms.ScrapeErrors.WithLabelValues("bad", "parse")); got != 1 {
		t.Fatalf("parse errors %v, want 1", got)
	}
	bad.srv.Close()
	s.ScrapeOnce(ctx)
	if got := testutil.ToFloat64(ms.ScrapeErrors.WithLabelValues("bad", "http")); got != 1 {
		t.Fatalf("http errors %v, want 1", got)
	}
	if reg.Healthy("bad") {
		t.Fatal("parse + connection failures are consecutive failures too")
	}
}

func TestScraperRunStopsOnCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := NewRegistry()
		reg.Set([]*Worker{{Name: "w", Address: "fake"}})
		var n atomic.Int32
		client := &http.Client{Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
			n.Add(1)
			return &http.Response{StatusCode: 200, Body: ioNopCloser(vllmMetrics), Header: http.Header{}}, nil
		})}
		s := NewScraper(reg, ScrapeOptions{Interval: time.Second, Client: client})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.Run(ctx); close(done) }()
		time.Sleep(3500 * time.Millisecond) // virtual time: rounds at 0, 1, 2, 3 s
		synctest.Wait()
		if got := n.Load(); got != 4 {
			t.Fatalf("scrapes in 3.5 s at 1 s interval = %d, want 4", got)
		}
		cancel()
		<-done
	})
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func ioNopCloser(s string) *nopBody { return &nopBody{strings.NewReader(s)} }

type nopBody struct{ *strings.Reader }

func (nopBody) Close() error { return nil }

// Issue 10 item 15: a changed process_start_time_seconds is a restart, reported before
// the scrape marks the worker healthy (so that its stale KV index is dropped first).
func TestScraperReportsRestart(t *testing.T) {
	f := newFakeVLLM(t)
	body := func(start string) string { return vllmMetrics + "process_start_time_seconds " + start + "\n" }
	f.body.Store(body("1.7e9"))
	reg := NewRegistry()
	reg.Set([]*Worker{{Name: "w", Address: f.addr()}})
	var restarts []string
	var healthyAtRestart []bool
	s := NewScraper(reg, ScrapeOptions{OnRestart: func(w string) {
		restarts = append(restarts, w)
		healthyAtRestart = append(healthyAtRestart, reg.Healthy(w))
	}})
	ctx := context.Background()
	s.ScrapeOnce(ctx)
	s.ScrapeOnce(ctx)
	if len(restarts) != 0 || reg.Load("w").ProcessStart != 1.7e9 {
		t.Fatalf("no restart yet: %v, load %+v", restarts, reg.Load("w"))
	}
	reg.SetHealthy("w", false) // e.g. the proxy saw it refuse connections
	f.body.Store(body("1.7000001e9"))
	s.ScrapeOnce(ctx)
	if len(restarts) != 1 || restarts[0] != "w" {
		t.Fatalf("restarts %v, want [w]", restarts)
	}
	if healthyAtRestart[0] {
		t.Fatal("OnRestart must run before the scrape marks the worker healthy again")
	}
	if !reg.Healthy("w") {
		t.Fatal("the successful scrape marks it healthy")
	}
	s.ScrapeOnce(ctx)
	if len(restarts) != 1 {
		t.Fatalf("restarts %v: the same start time again is no restart", restarts)
	}
}

// fakeClock is a settable clock for ScrapeOptions.Now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Issue 17 defect: with 1 MB bodies at concurrency ≥ 50, kvroute was too starved of CPU
// to finish a scrape of an instant worker within the 1 s timeout, three rounds in a row,
// and marked every worker unhealthy (503 "no healthy worker"). The starvation is injected
// deterministically: the transport advances the scraper's clock past the deadline (our
// goroutine descheduled for 3 s) before failing with the deadline error, as net/http does
// when the deadline passes. Before the fix the worker was marked unhealthy after 3 rounds.
func TestScrapeTimeoutWhileKvrouteStarvedDoesNotMarkWorkerDown(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	var starve atomic.Bool
	starve.Store(true)
	client := &http.Client{Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
		if starve.Load() {
			clk.Advance(3 * time.Second) // kvroute did not run for 3 s
			return nil, context.DeadlineExceeded
		}
		return &http.Response{StatusCode: 200, Body: ioNopCloser(vllmMetrics), Header: http.Header{}}, nil
	})}
	reg := NewRegistry()
	reg.Set([]*Worker{{Name: "w", Address: "fake"}})
	ms := metrics.NewUnregistered().Scoring
	s := NewScraper(reg, ScrapeOptions{Interval: time.Second, Client: client, Now: clk.Now, Metrics: ms,
		Lag: func(from, to time.Time) time.Duration { return 0 }}) // only the scrape's own overshoot
	ctx := context.Background()
	for range 5 {
		s.ScrapeOnce(ctx)
	}
	if !reg.Healthy("w") {
		t.Fatal("5 scrapes that timed out only because kvroute was starved marked the worker unhealthy")
	}
	if got := testutil.ToFloat64(ms.ScrapeErrors.WithLabelValues("w", "starved")); got != 5 {
		t.Fatalf("starved scrapes counted %v, want 5", got)
	}
	if got := testutil.ToFloat64(ms.ScrapeErrors.WithLabelValues("w", "timeout")); got != 0 {
		t.Fatalf("starved scrapes must not count as worker timeouts: %v", got)
	}
	starve.Store(false)
	s.ScrapeOnce(ctx)
	if l := reg.Load("w"); l.Waiting != 3 {
		t.Fatalf("the next scrape records the load: %+v", l)
	}
}

// The heartbeat's lag (ScrapeOptions.Lag) makes a timeout inconclusive too; a worker that
// is slow while kvroute runs on time is still marked unhealthy, and a refused connection
// counts even while kvroute is starved. Virtual time (synctest): the 1 s timeouts pass at once.
func TestScrapeTimeoutCountsOnlyWhenKvrouteRanOnTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var refuse atomic.Bool
		hang := roundTrip(func(r *http.Request) (*http.Response, error) {
			if refuse.Load() {
				return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
			}
			<-r.Context().Done() // a worker that never answers
			return nil, r.Context().Err()
		})
		var lag atomic.Int64
		reg := NewRegistry()
		reg.Set([]*Worker{{Name: "w", Address: "fake"}})
		ms := metrics.NewUnregistered().Scoring
		s := NewScraper(reg, ScrapeOptions{Interval: time.Second, Client: &http.Client{Transport: hang}, Metrics: ms,
			Lag: func(from, to time.Time) time.Duration { return time.Duration(lag.Load()) }})
		ctx := context.Background()

		lag.Store(int64(400 * time.Millisecond)) // heartbeat 400 ms late: kvroute starved
		for range 5 {
			s.ScrapeOnce(ctx)
		}
		if !reg.Healthy("w") {
			t.Fatal("timeouts while the heartbeat ran 400 ms late must not mark the worker down")
		}
		lag.Store(int64(2 * time.Millisecond)) // kvroute on time: the worker is the slow one
		for i := range 3 {
			if !reg.Healthy("w") {
				t.Fatalf("marked down after %d timeouts, want 3 (the inconclusive ones must not add)", i)
			}
			s.ScrapeOnce(ctx)
		}
		if reg.Healthy("w") {
			t.Fatal("3 timeouts with kvroute on time must mark the worker unhealthy")
		}
		if got := testutil.ToFloat64(ms.ScrapeErrors.WithLabelValues("w", "timeout")); got != 3 {
			t.Fatalf("timeouts counted %v, want 3", got)
		}

		reg.SetHealthy("w", true)
		s.fails["w"] = 0
		refuse.Store(true)
		lag.Store(int64(time.Second))
		for range 3 {
			s.ScrapeOnce(ctx)
		}
		if reg.Healthy("w") {
			t.Fatal("refused connections count even while kvroute is starved")
		}
	})
}

func TestLagMonitorMax(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := NewLagMonitor(50 * time.Millisecond)
	if got := m.Max(t0, t0.Add(time.Hour)); got != 0 {
		t.Fatalf("not running: lag %v, want 0", got)
	}
	m.beat(t0)                             // first beat: due t0+50ms
	m.beat(t0.Add(350 * time.Millisecond)) // ran 300 ms late; due t0+400ms
	m.beat(t0.Add(410 * time.Millisecond)) // 10 ms late; due t0+460ms
	if got := m.Max(t0, t0.Add(450*time.Millisecond)); got != 300*time.Millisecond {
		t.Fatalf("Max over both beats = %v, want 300ms", got)
	}
	if got := m.Max(t0.Add(400*time.Millisecond), t0.Add(450*time.Millisecond)); got != 10*time.Millisecond {
		t.Fatalf("Max after the late beat = %v, want 10ms", got)
	}
	// The pending beat (due t0+460ms) has not run at t0+960ms: 500 ms overdue.
	if got := m.Max(t0.Add(400*time.Millisecond), t0.Add(960*time.Millisecond)); got != 500*time.Millisecond {
		t.Fatalf("overdue pending beat = %v, want 500ms", got)
	}
}
