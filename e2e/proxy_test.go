package e2e

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
)

// The same journeys through `kvroute proxy` (no Envoy): same decisions, same errors,
// same ticket accounting.

func TestProxyJourney(t *testing.T) {
	f := newFixture(t, fixtureOpts{proxy: true, cfg: func(c *config.Config) {
		c.ExtProc.MaxBodyBytes = 4096
		c.ExtProc.WorkerHeader = "x-kvroute-worker"
	}})
	// streamed and non-streamed answers, each API shape
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", chatStream},
		{"/v1/chat/completions", chatNonStream},
		{"/v1/completions", `{"model":"m","prompt":[1,2,3],"stream":true}`},
		{"/v1/messages", `{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}`},
	} {
		st, h, body := f.do("POST", c.path, c.body, "X-Gateway-Destination-Endpoint", "6.6.6.6:1")
		if st != 200 || !strings.Contains(body, "Hello") || h.Get("X-Kvroute-Worker") != h.Get("X-Served-By") {
			t.Fatalf("%s: status %d headers %v body %q", c.path, st, h, body)
		}
	}
	m := f.app.Metrics.Router.TicketsReleased
	if testutil.ToFloat64(m.WithLabelValues("first_token")) != 3 || testutil.ToFloat64(m.WithLabelValues("done")) != 4 {
		t.Fatalf("first_token=%v done=%v, want 3 and 4", testutil.ToFloat64(m.WithLabelValues("first_token")), testutil.ToFloat64(m.WithLabelValues("done")))
	}
	// headers-only, other path: load-only pick
	if st, _, body := f.do("GET", "/v1/models", ""); st != 200 || !strings.Contains(body, "list") {
		t.Fatalf("GET /v1/models: %d %q", st, body)
	}
	// refusals: same status and JSON as the ext_proc path
	st, h, body := f.do("POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"`+strings.Repeat("x", 5000)+`"}]}`)
	checkOpenAIError(t, st, h, body, 413, "invalid_request_error")
	st, h, body = f.do("POST", "/v1/chat/completions", `{"model":`)
	checkOpenAIError(t, st, h, body, 400, "invalid_request_error")
	st, h, body = f.do("POST", "/v1/chat/completions", `{"model":"zzz","messages":[{"role":"user","content":"x"}]}`)
	checkOpenAIError(t, st, h, body, 404, "NotFoundError")
	if f.inFlight() != 0 {
		t.Fatal("tickets leaked")
	}
}

func TestProxyUpstreamFailures(t *testing.T) {
	f := newFixture(t, fixtureOpts{proxy: true, setup: func(ws []*testWorker) {
		for _, w := range ws {
			w.status.Store(503)
		}
	}, cfg: func(c *config.Config) { c.Scoring.Scrape.Interval = 0 }}) // health is set by hand below
	if st, _, body := f.do("POST", "/v1/chat/completions", chatStream); st != 503 || !strings.Contains(body, "worker failure") {
		t.Fatalf("upstream 5xx must pass through: %d %q", st, body)
	}
	if testutil.ToFloat64(f.app.Metrics.Router.TicketsReleased.WithLabelValues("done")) != 1 || f.inFlight() != 0 {
		t.Fatal("a 5xx completes the ticket")
	}
	// Workers that are down: the first refused connection is retried once on another
	// worker; that one fails too → 502 with the OpenAI error JSON (no backend address),
	// both tickets aborted. The scraper is off here, so nothing could revive a worker:
	// passive health stays off and both remain healthy (proxy.Options.NoPassiveHealth).
	for _, w := range f.workers {
		w.srv.Close()
	}
	st, h, body := f.do("POST", "/v1/chat/completions", chatStream)
	checkOpenAIError(t, st, h, body, 502, "upstream_error")
	if strings.Contains(body, "127.0.0.1") {
		t.Fatalf("502 body leaks the backend address: %q", body)
	}
	unhealthy := 0
	for _, w := range f.workers {
		if !f.app.Registry.Healthy(w.name) {
			unhealthy++
		}
	}
	if testutil.ToFloat64(f.app.Metrics.ExtProc.Aborts.WithLabelValues("upstream_error")) != 2 || f.inFlight() != 0 || unhealthy != 0 {
		t.Fatalf("unreachable workers: want 2 attempts aborted and no worker marked unhealthy (scraper off), got %v and %d",
			testutil.ToFloat64(f.app.Metrics.ExtProc.Aborts.WithLabelValues("upstream_error")), unhealthy)
	}
	for _, w := range f.workers {
		f.app.Registry.SetHealthy(w.name, false)
	}
	st, h, body = f.do("POST", "/v1/chat/completions", chatStream)
	checkOpenAIError(t, st, h, body, 503, "service_unavailable")
}

func TestProxyClientDisconnectMidStream(t *testing.T) {
	gate := make(chan struct{})
	f := newFixture(t, fixtureOpts{proxy: true, setup: func(ws []*testWorker) {
		for _, w := range ws {
			w.gate = gate
		}
	}})
	defer close(gate)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", f.url+"/v1/chat/completions", strings.NewReader(chatStream))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(resp.Body)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, `"Hello"`) { // arrived unbuffered (FlushInterval -1)
			break
		}
	}
	if testutil.ToFloat64(f.app.Metrics.Router.TicketsReleased.WithLabelValues("first_token")) != 1 {
		t.Fatal("first token must be reported while streaming")
	}
	cancel()
	resp.Body.Close()
	f.waitInFlight(0)
	if testutil.ToFloat64(f.app.Metrics.Router.TicketsReleased.WithLabelValues("abort")) != 1 {
		t.Fatal("a client disconnect aborts the ticket")
	}
}

// The same burst through kvroute proxy: the same router core books each pick under its lock.
func TestProxyBurstSpreadsByLoad(t *testing.T) {
	burstSpreadsByLoad(t, fixtureOpts{proxy: true, workers: 4}, 100)
}
