package proxy

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// firstHealthy picks the first candidate (candidates are sorted by name), so a dead
// worker named "a" is always tried before a live "b".
type firstHealthy struct{}

func (firstHealthy) Name() string { return "first" }
func (firstHealthy) Pick(*scoring.Input, []scoring.Candidate) scoring.Decision {
	return scoring.Decision{Index: 0, Reason: "first"}
}

// deadAddr returns a loopback address nothing listens on (a listener opened and closed).
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// newPassive: a proxy over workers named in order with the given addresses.
func newPassive(t *testing.T, addrs ...string) (http.Handler, *router.Router, *workers.Registry, *metrics.Set) {
	t.Helper()
	reg := workers.NewRegistry()
	var ws []*workers.Worker
	for i, a := range addrs {
		ws = append(ws, &workers.Worker{Name: string(rune('a' + i)), Address: a, Models: []string{"m"}})
	}
	reg.Set(ws)
	ms := metrics.NewUnregistered()
	r := router.New(router.Options{Registry: reg, Models: []router.Model{{Name: "m"}}, Metrics: ms, Policy: firstHealthy{}})
	return New(Options{Router: r, Config: config.Default().ExtProc, Metrics: ms}), r, reg, ms
}

const chatReq = `{"model":"m","messages":[{"role":"user","content":"x"}]}`

func post(h http.Handler) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(chatReq)))
	return rec
}

// A worker that refuses the connection is marked unhealthy and the request is served by
// another pick; its ticket is aborted, nothing leaks, and the next request skips it.
func TestDialFailureMarksUnhealthyAndRetries(t *testing.T) {
	var hits atomic.Int32
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"echo":`+string(b)+`,"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
	t.Cleanup(live.Close)
	h, r, reg, ms := newPassive(t, deadAddr(t), strings.TrimPrefix(live.URL, "http://"))
	rec := post(h)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"echo":`+chatReq) || hits.Load() != 1 {
		t.Fatalf("retry: %d %q (hits %d), want 200 with the whole body forwarded once", rec.Code, rec.Body.String(), hits.Load())
	}
	if reg.Healthy("a") || !reg.Healthy("b") {
		t.Fatalf("health a=%v b=%v, want a unhealthy only", reg.Healthy("a"), reg.Healthy("b"))
	}
	if r.InFlight() != 0 || testutil.ToFloat64(ms.ExtProc.Aborts.WithLabelValues("upstream_error")) != 1 ||
		testutil.ToFloat64(ms.ExtProc.ProxyUpstreamErrors) != 1 || testutil.ToFloat64(ms.Router.TicketsReleased.WithLabelValues("done")) != 1 {
		t.Fatal("the failed attempt must be aborted and counted once, the retry completed")
	}
	if rec := post(h); rec.Code != 200 || testutil.ToFloat64(ms.ExtProc.ProxyUpstreamErrors) != 1 {
		t.Fatalf("next request must go straight to b: %d, upstream errors %v", rec.Code, testutil.ToFloat64(ms.ExtProc.ProxyUpstreamErrors))
	}
}

// Every worker down: one retry only, both marked unhealthy, and the 502 names no
// backend address.
func TestDialFailureRetriesOnceThen502(t *testing.T) {
	a, b := deadAddr(t), deadAddr(t)
	h, r, reg, ms := newPassive(t, a, b)
	rec := post(h)
	body := rec.Body.String()
	if rec.Code != 502 || !strings.Contains(body, `"upstream worker unavailable"`) || strings.Contains(body, "127.0.0.1") || strings.Contains(body, "dial") {
		t.Fatalf("%d %q, want 502 'upstream worker unavailable' without the address", rec.Code, body)
	}
	if reg.Healthy("a") || reg.Healthy("b") || r.InFlight() != 0 ||
		testutil.ToFloat64(ms.ExtProc.Aborts.WithLabelValues("upstream_error")) != 2 || testutil.ToFloat64(ms.ExtProc.ProxyUpstreamErrors) != 2 {
		t.Fatal("two attempts, both workers unhealthy, both tickets aborted")
	}
}

// The only worker down: the retry finds no healthy worker → 503 with retry-after.
func TestDialFailureOnlyWorker503RetryAfter(t *testing.T) {
	h, r, reg, _ := newPassive(t, deadAddr(t))
	rec := post(h)
	if rec.Code != 503 || rec.Header().Get("Retry-After") != "1" || !strings.Contains(rec.Body.String(), "service_unavailable") {
		t.Fatalf("%d %v %q", rec.Code, rec.Header(), rec.Body.String())
	}
	if reg.Healthy("a") || r.InFlight() != 0 {
		t.Fatal("worker a must be unhealthy, no booking left")
	}
}

// A failure after the connection was made (reset before response headers) is not
// retried and does not touch health: the worker may have started on the request.
func TestResetBeforeHeadersNotRetried(t *testing.T) {
	var hits atomic.Int32
	reset := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			c.Close()
		}
	}))
	t.Cleanup(reset.Close)
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits.Add(100) }))
	t.Cleanup(live.Close)
	h, r, reg, _ := newPassive(t, strings.TrimPrefix(reset.URL, "http://"), strings.TrimPrefix(live.URL, "http://"))
	rec := post(h)
	if rec.Code != 502 || hits.Load() != 1 || !reg.Healthy("a") || r.InFlight() != 0 || strings.Contains(rec.Body.String(), "127.0.0.1") {
		t.Fatalf("%d %q hits %d healthy %v", rec.Code, rec.Body.String(), hits.Load(), reg.Healthy("a"))
	}
}

// With passive health off (no scraper to revive workers), a dial failure still retries
// once elsewhere but leaves the worker healthy: otherwise it would stay out forever.
func TestDialFailureWithoutPassiveHealth(t *testing.T) {
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
	t.Cleanup(live.Close)
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "a", Address: deadAddr(t), Models: []string{"m"}}, {Name: "b", Address: strings.TrimPrefix(live.URL, "http://"), Models: []string{"m"}}})
	ms := metrics.NewUnregistered()
	r := router.New(router.Options{Registry: reg, Models: []router.Model{{Name: "m"}}, Metrics: ms, Policy: firstHealthy{}})
	h := New(Options{Router: r, Config: config.Default().ExtProc, Metrics: ms, NoPassiveHealth: true})
	if rec := post(h); rec.Code != 200 {
		t.Fatalf("retry must still serve the request: %d %s", rec.Code, rec.Body.String())
	}
	if !reg.Healthy("a") {
		t.Fatal("with NoPassiveHealth the unreachable worker must stay healthy")
	}
}
