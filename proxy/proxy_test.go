package proxy

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/workers"
)

func newProxy(t *testing.T, upstream http.Handler) (http.Handler, *router.Router, *metrics.Set) {
	t.Helper()
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "w", Address: strings.TrimPrefix(up.URL, "http://"), Models: []string{"m"}}})
	ms := metrics.NewUnregistered()
	r := router.New(router.Options{Registry: reg, Models: []router.Model{{Name: "m"}}, Metrics: ms})
	cfg := config.Default().ExtProc
	cfg.MaxBodyBytes = 1024
	return New(Options{Router: r, Config: cfg, Metrics: ms}), r, ms
}

// A chunked body (no content-length) over the limit is refused after reading limit+1 bytes.
func TestChunkedOversize413(t *testing.T) {
	h, r, _ := newProxy(t, http.NotFoundHandler())
	req := httptest.NewRequest("POST", "/v1/chat/completions", io.MultiReader(strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"`), strings.NewReader(strings.Repeat("x", 4096))))
	req.ContentLength = -1
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 413 || rec.Header().Get("Content-Type") != "application/json" || r.InFlight() != 0 {
		t.Fatalf("%d %v %q", rec.Code, rec.Header(), rec.Body.String())
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("client reset") }

// A body that cannot be read is a 400.
func TestBodyReadError400(t *testing.T) {
	h, _, _ := newProxy(t, http.NotFoundHandler())
	req := httptest.NewRequest("POST", "/v1/chat/completions", failingReader{})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 400 || !strings.Contains(rec.Body.String(), "client reset") {
		t.Fatalf("%d %q", rec.Code, rec.Body.String())
	}
}

// An upstream that breaks mid-body aborts the ticket (no leak, counted).
func TestUpstreamResetMidBodyAborts(t *testing.T) {
	h, r, ms := newProxy(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Length", "1000") // promise more than is sent
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
	}))
	req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if r.InFlight() != 0 {
		t.Fatal("ticket leaked")
	}
	if testutil.ToFloat64(ms.Router.TicketsReleased.WithLabelValues("first_token")) != 1 || testutil.ToFloat64(ms.ExtProc.Aborts.WithLabelValues("upstream_error")) != 1 {
		t.Fatalf("first token then upstream abort expected: %q", rec.Body.String())
	}
}

// A panic in a request is recovered, answered 500 with the error JSON, and counted.
func TestPanicRecovered(t *testing.T) {
	h := New(Options{Router: nil, Config: config.Default().ExtProc})
	req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"x"}]}`))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 500 || !strings.Contains(rec.Body.String(), "internal_error") {
		t.Fatalf("%d %q", rec.Code, rec.Body.String())
	}
}

func TestStatusClass(t *testing.T) {
	for code, want := range map[int]string{0: "error", 200: "2xx", 302: "3xx", 404: "4xx", 503: "5xx"} {
		if got := statusClass(code); got != want {
			t.Errorf("%d → %s, want %s", code, got, want)
		}
	}
}
