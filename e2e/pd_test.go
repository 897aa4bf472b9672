package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/sim"
)

// pdSim is one simulated vLLM engine of a P/D fleet (vllm-sim --kv-role) on loopback,
// with the generation requests it received.
type pdSim struct {
	w    *sim.Worker
	addr string
	mu   sync.Mutex
	reqs []pdSeen
}

type pdSeen struct {
	header http.Header
	body   map[string]json.RawMessage
}

func (s *pdSim) seen() []pdSeen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]pdSeen(nil), s.reqs...)
}

// startPDSim runs a simulated engine with the KV role, its side channel (remote_host,
// remote_port of its prefill answers) its own HTTP address as cmd/vllm-sim sets it.
func startPDSim(t *testing.T, role string, seed uint64) *pdSim {
	t.Helper()
	prof, err := sim.LookupProfile("h100-8b")
	if err != nil {
		t.Fatal(err)
	}
	prof.Model, prof.KVTransferLatency = "m", time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w, err := sim.NewWorker(sim.WorkerOptions{Profile: prof, Model: "m", Seed: seed, KVRole: role,
		SideChannel: ln.Addr().String(), PromptTokensDetails: true})
	if err != nil {
		t.Fatal(err)
	}
	s := &pdSim{w: w, addr: ln.Addr().String()}
	rec := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			b, _ := io.ReadAll(r.Body)
			var m map[string]json.RawMessage
			_ = json.Unmarshal(b, &m)
			s.mu.Lock()
			s.reqs = append(s.reqs, pdSeen{header: r.Header.Clone(), body: m})
			s.mu.Unlock()
			r.Body = io.NopCloser(strings.NewReader(string(b)))
		}
		w.ServeHTTP(rw, r)
	})
	srv := &http.Server{Handler: rec, ReadHeaderTimeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Runner.Run(ctx); close(done) }()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); cancel(); <-done })
	return s
}

// pdFleet starts a prefill engine (kv_producer) and a decode engine (kv_consumer) and
// configures them as workers p (role prefill) and d (role decode). prefillDown
// configures p at an address nothing listens on. The pick always pairs (a prompt over
// one uncached token is never prefilled locally).
func pdFleet(t *testing.T, prefillDown bool) (p, d *pdSim, fleet func(*config.Config)) {
	p, d = startPDSim(t, sim.KVRoleProducer, 1), startPDSim(t, sim.KVRoleConsumer, 2)
	paddr := p.addr
	if prefillDown {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		paddr = ln.Addr().String()
		ln.Close()
	}
	return p, d, func(c *config.Config) {
		// Every prompt over one uncached token is prefilled remotely: the pick's own
		// local-or-remote choice is pdcore's to test, the delivery of a remote one ours.
		c.Scoring.PDMaxLocalPrefillTokens = 1
		if prefillDown {
			c.Scoring.Scrape.Interval = 0 // the scraper would mark p unhealthy before the request
		}
		c.Workers = append(c.Workers,
			config.Worker{Name: "d", Address: d.addr, Models: []string{"m"}, Role: "decode"},
			config.Worker{Name: "p", Address: paddr, Models: []string{"m"}, Role: "prefill"})
	}
}

// words is a stand-in-tokenizer prompt of n tokens (t1 … tn).
func words(n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("t%d", i+1)
	}
	return strings.Join(w, " ")
}

// P/D through kvroute proxy on vllm-sim: the prefill engine sees the prefill leg
// (kv_transfer_params do_remote_decode, max_tokens 1, stream false), the decode engine
// the client's request with the prefill's kv_transfer_params, and it reads the prompt's
// KV instead of prefilling it (39 of 40 tokens external_kv_transfer, cached_tokens 39).
func TestPDProxyTwoStepExchangeOnVLLMSim(t *testing.T) {
	p, d, fleet := pdFleet(t, false)
	f := newFixture(t, fixtureOpts{proxy: true, fleet: fleet})
	st, _, body := f.do("POST", "/v1/completions", `{"model":"m","prompt":"`+words(40)+`","max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`)
	if st != 200 || !strings.Contains(body, `"cached_tokens":39`) || !strings.Contains(body, "[DONE]") {
		t.Fatalf("client got %d %s; want the decode engine's stream, 39 prompt tokens read", st, body)
	}
	f.waitInFlight(0)
	ps, ds := p.seen(), d.seen()
	if len(ps) != 1 || len(ds) != 1 {
		t.Fatalf("prefill engine saw %d requests, decode %d; want one each", len(ps), len(ds))
	}
	pb := ps[0].body
	if string(pb["max_tokens"]) != "1" || string(pb["stream"]) != "false" || pb["stream_options"] != nil ||
		!strings.Contains(string(pb["kv_transfer_params"]), `"do_remote_decode":true`) {
		t.Fatalf("prefill leg %v: want max_tokens 1, stream false, no stream_options, do_remote_decode", pb)
	}
	var kv struct {
		DoRemotePrefill bool   `json:"do_remote_prefill"`
		BlockIDs        []int  `json:"remote_block_ids"`
		Host            string `json:"remote_host"`
	}
	db := ds[0].body
	if err := json.Unmarshal(db["kv_transfer_params"], &kv); err != nil || !kv.DoRemotePrefill || len(kv.BlockIDs) != 3 || kv.Host != "127.0.0.1" {
		t.Fatalf("decode leg kv_transfer_params %s: want the prefill engine's answer", db["kv_transfer_params"])
	}
	if string(db["max_tokens"]) != "4" || string(db["stream"]) != "true" {
		t.Fatalf("decode leg %v: want the client's max_tokens and stream", db)
	}
	if got := d.w.Runner.Stats().KVTransferTokens; got != 39 {
		t.Fatalf("decode engine read %d prompt tokens, want 39 (all but the last, not prefilled)", got)
	}
	if p.w.Runner.Stats().HeldRequests != 0 {
		t.Fatal("the prefill engine still holds KV the decode engine read")
	}
	m := f.app.Metrics
	if testutil.ToFloat64(m.ExtProc.ProxyPrefillLegs.WithLabelValues("ok")) != 1 || testutil.ToFloat64(m.Router.PDFallbacks) != 0 ||
		testutil.ToFloat64(m.Router.PDDecisions.WithLabelValues("remote")) != 1 {
		t.Fatal("want one remote pair pick, one ok prefill leg, no fallback")
	}
}

// A prefill worker that is down: the decode engine prefills locally (the client's body,
// no kv_transfer_params), the fallback counted. (The scraper is off so that it cannot
// mark the worker down before the request; without it kvroute keeps passive health off,
// which proxy/pd_test.go covers.)
func TestPDProxyPrefillDownFallsBackToLocalPrefill(t *testing.T) {
	_, d, fleet := pdFleet(t, true)
	f := newFixture(t, fixtureOpts{proxy: true, fleet: fleet})
	st, _, body := f.do("POST", "/v1/completions", `{"model":"m","prompt":"`+words(40)+`","max_tokens":2}`)
	if st != 200 || strings.Contains(body, "cached_tokens") {
		t.Fatalf("client got %d %s; want the decode engine's answer, prefilled locally", st, body)
	}
	f.waitInFlight(0)
	ds := d.seen()
	if len(ds) != 1 || ds[0].body["kv_transfer_params"] != nil {
		t.Fatalf("decode engine saw %d requests (%v); want one without kv_transfer_params", len(ds), ds)
	}
	if got := d.w.Runner.Stats().KVTransferTokens; got != 0 {
		t.Fatalf("decode engine read %d tokens, want 0 (local prefill)", got)
	}
	m := f.app.Metrics
	if testutil.ToFloat64(m.Router.PDFallbacks) != 1 || testutil.ToFloat64(m.ExtProc.ProxyPrefillLegs.WithLabelValues("connect_error")) != 1 {
		t.Fatal("the fallback must be counted (router fallbacks, proxy prefill legs connect_error)")
	}
}

// P/D through ext_proc, llm-d's convention, on the Envoy stand-in: the request goes to
// the decode worker (destination header, as ORIGINAL_DST routes it) with the prefill
// worker in x-prefiller-host-port, the client's own copy replaced. The stand-in does
// not run llm-d's routing sidecar, so the decode engine prefills locally here: this
// checks what kvroute tells Envoy, not the sidecar's exchange.
func TestPDExtProcSetsPrefillerHeaderOnVLLMSim(t *testing.T) {
	p, d, fleet := pdFleet(t, false)
	f := newFixture(t, fixtureOpts{envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed}, fleet: fleet})
	st, _, body := f.do("POST", "/v1/completions", `{"model":"m","prompt":"`+words(40)+`","max_tokens":2}`,
		extproc.PrefillHeader, "203.0.113.9:1")
	if st != 200 {
		t.Fatalf("client got %d %s", st, body)
	}
	f.waitInFlight(0)
	ds := d.seen()
	if len(ds) != 1 || len(p.seen()) != 0 {
		t.Fatalf("decode engine saw %d requests, prefill %d; want the request at the decode worker only", len(ds), len(p.seen()))
	}
	if got := ds[0].header.Values(extproc.PrefillHeader); len(got) != 1 || got[0] != p.addr {
		t.Fatalf("%s at the decode worker = %q, want only kvroute's %s", extproc.PrefillHeader, got, p.addr)
	}
	if got := ds[0].header.Get("x-gateway-destination-endpoint"); got != d.addr {
		t.Fatalf("destination %q, want the decode worker %s", got, d.addr)
	}
}

// Through ext_proc an aggregated pick has no prefill worker: a client's
// x-prefiller-host-port is removed before the request reaches the worker (Envoy
// applies remove_headers), so no sidecar prefills where the client says.
func TestPDExtProcStripsClientPrefillerHeader(t *testing.T) {
	f := newFixture(t, fixtureOpts{envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed}})
	st, _, body := f.do("POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		extproc.PrefillHeader, "203.0.113.9:1")
	if st != 200 {
		t.Fatalf("%d %s", st, body)
	}
	served := 0
	for _, w := range f.workers {
		h, _ := w.last()
		if h == nil {
			continue
		}
		served++
		if h.Get(extproc.PrefillHeader) != "" {
			t.Fatalf("worker %s got the client's %s %q", w.name, extproc.PrefillHeader, h.Get(extproc.PrefillHeader))
		}
	}
	if served != 1 {
		t.Fatalf("%d workers served the request, want 1", served)
	}
}
