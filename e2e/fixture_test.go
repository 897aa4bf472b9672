package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/app"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/testrun"
	"github.com/kvroute/kvroute/sim"
)

// fixture is the one end-to-end setup: test workers, kvroute in process (app.New +
// app.Run on ephemeral listeners), and in front of it the Envoy stand-in (Envoy != nil)
// or kvroute's own proxy (ProxyURL). Options go in fixtureOpts; please do not add
// sibling constructors.
type fixture struct {
	t        *testing.T
	workers  []*testWorker
	sims     []*sim.Worker // fixtureOpts.simAdapters: the vllm-sim workers, in place of workers
	app      *app.App
	envoy    *Envoy
	url      string // where clients send requests: the stand-in, or the proxy
	adminURL string
}

type fixtureOpts struct {
	workers int                  // 0 → 2
	proxy   bool                 // front = kvroute proxy instead of the stand-in
	envoy   Config               // stand-in config (ExtProcAddr filled in)
	cfg     func(*config.Config) // kvroute config tweaks
	setup   func([]*testWorker)  // worker knobs, before kvroute starts
	// simAdapters, when set, makes the workers simulated vLLM engines (package sim, as
	// vllm-sim runs them) serving model m and these LoRA adapters (--lora-modules) in
	// simMaxLoRAs slots; kvroute is configured with each adapter a model of base m.
	simAdapters []string
	simMaxLoRAs int
	// fleet, when set, starts the workers itself and adds them to the config, in place
	// of the test workers (e.g. the P/D fleet of simulated engines, pd_test.go).
	fleet func(*config.Config)
}

func newFixture(t *testing.T, o fixtureOpts) *fixture {
	t.Helper()
	if o.workers == 0 {
		o.workers = 2
	}
	f := &fixture{t: t}
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m"}}
	// the test workers serve Anthropic's /v1/messages too (not a default proxy path:
	// not every vLLM version serves it)
	cfg.Proxy.Paths = append(cfg.Proxy.Paths, "/v1/messages")
	if o.simAdapters != nil {
		f.sims = simWorkers(t, &cfg, o.workers, o.simAdapters, o.simMaxLoRAs)
	}
	if o.fleet != nil {
		o.fleet(&cfg)
	}
	for i := 0; i < o.workers && o.simAdapters == nil && o.fleet == nil; i++ {
		w := newTestWorker(t, "w"+string(rune('1'+i)))
		f.workers = append(f.workers, w)
		cfg.Workers = append(cfg.Workers, config.Worker{Name: w.name, Address: w.addr()})
	}
	if o.setup != nil {
		o.setup(f.workers)
	}
	if o.cfg != nil {
		o.cfg(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	a, err := app.New(&cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	f.app = a
	ls := app.Listeners{Admin: testrun.Listen(t)}
	if o.proxy {
		ls.Proxy = testrun.Listen(t)
	} else {
		ls.ExtProc = testrun.Listen(t)
	}
	testrun.Start(t, a, ls)
	f.adminURL = "http://" + ls.Admin.Addr().String()
	if o.proxy {
		f.url = "http://" + ls.Proxy.Addr().String()
		return f
	}
	o.envoy.ExtProcAddr = ls.ExtProc.Addr().String()
	if o.envoy.RequestBodyMode == FullDuplex || o.envoy.ResponseBodyMode == FullDuplex {
		o.envoy.RequestTrailers, o.envoy.ResponseTrailers = true, true // CFG requires trailer SEND
	}
	e, err := New(generous(o.envoy))
	if err != nil {
		t.Fatal(err)
	}
	f.envoy = e
	front := httptest.NewServer(e)
	t.Cleanup(func() { front.Close(); e.Close() })
	f.url = front.URL
	return f
}

// do sends a request and returns status, headers and the whole body.
func (f *fixture) do(method, path, body string, hdr ...string) (int, http.Header, string) {
	f.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, f.url+path, rd)
	if err != nil {
		f.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// inFlight reads the open tickets from the admin view (/debug/workers).
func (f *fixture) inFlight() int {
	f.t.Helper()
	resp, err := http.Get(f.adminURL + "/debug/workers")
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		InFlight []json.RawMessage `json:"in_flight"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		f.t.Fatal(err)
	}
	return len(v.InFlight)
}

// waitInFlight polls until the open-ticket count is want (the release after a reset
// happens on kvroute's stream goroutine, with no event a test could wait on).
func (f *fixture) waitInFlight(want int) {
	f.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for f.app.Router.InFlight() != want {
		if time.Now().After(deadline) {
			f.t.Fatalf("in flight = %d, want %d", f.app.Router.InFlight(), want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (f *fixture) workerByAddr(addr string) *testWorker {
	for _, w := range f.workers {
		if w.addr() == addr {
			return w
		}
	}
	return nil
}

// checkOpenAIError asserts an OpenAI-style error reply.
func checkOpenAIError(t *testing.T, status int, h http.Header, body string, wantStatus int, wantType string) {
	t.Helper()
	if status != wantStatus {
		t.Fatalf("status = %d, want %d (body %q)", status, wantStatus, body)
	}
	if ct := h.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content-type = %q, want application/json", ct)
	}
	var e struct {
		Error struct {
			Message, Type string
			Code          int
		}
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Type != wantType || e.Error.Code != wantStatus || e.Error.Message == "" {
		t.Fatalf("body %q: want OpenAI error of type %s: %v", body, wantType, err)
	}
}

const (
	chatStream    = `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello there"}]}`
	chatNonStream = `{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":16}`
)

// burstSpreadsByLoad sends a burst of n identical concurrent requests through the front
// opts describes (opts.workers workers, each holding every request until all arrived)
// and checks that every worker got n/workers of them: each pick is booked under the lock
// that made it, so later picks see earlier bookings. Shared by the Envoy stand-in and
// the proxy tests.
func burstSpreadsByLoad(t *testing.T, opts fixtureOpts, n int) {
	t.Helper()
	nw := opts.workers
	hold := make(chan struct{})
	arrived := make(chan string, n)
	opts.setup = func(ws []*testWorker) {
		for _, w := range ws {
			w.hold, w.arrived = hold, arrived
		}
	}
	f := newFixture(t, opts)
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(hold) }) })
	var wg sync.WaitGroup
	errs := make(chan error, n)
	tr := &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: n}
	cl := &http.Client{Transport: tr}
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := cl.Post(f.url+"/v1/chat/completions", "application/json", strings.NewReader(chatNonStream))
			if err != nil {
				errs <- err
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				errs <- fmt.Errorf("status %d", resp.StatusCode)
			}
		}()
	}
	per := map[string]int{}
	for i := 0; i < n; i++ {
		select {
		case w := <-arrived:
			per[w]++
		case err := <-errs:
			t.Fatalf("after %d arrivals: %v", i, err)
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d of %d requests reached a worker", i, n)
		}
	}
	if got := f.inFlight(); got != n {
		t.Fatalf("in flight with all requests held = %d, want %d", got, n)
	}
	release.Do(func() { close(hold) })
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, w := range f.workers {
		if per[w.name] != n/nw {
			t.Fatalf("spread %v: want %d on each worker (identical requests, least booked wins ties)", per, n/nw)
		}
	}
	if f.inFlight() != 0 {
		t.Fatal("tickets leaked")
	}
}
