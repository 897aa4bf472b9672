package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/jsonvalue"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workers"
)

// seen records the bodies and X-Request-Id headers of the generation requests an
// upstream received.
type seen struct {
	mu     sync.Mutex
	bodies []string
	ids    []string
}

func (s *seen) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == sim.PathKVRead { // the decode worker's KV read, not a leg
			next.ServeHTTP(w, r)
			return
		}
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.bodies, s.ids = append(s.bodies, string(b)), append(s.ids, r.Header.Get("X-Request-Id"))
		s.mu.Unlock()
		r.Body = io.NopCloser(strings.NewReader(string(b)))
		next.ServeHTTP(w, r)
	})
}

func (s *seen) all() ([]string, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.bodies...), append([]string(nil), s.ids...)
}

// simWorker runs a real simulated vLLM worker (package sim) on loopback, its side
// channel its own address, every request recorded.
func simWorker(t *testing.T, role string) (*sim.Worker, string, *seen) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := sim.Profile{Name: "t", Model: "m", StepOverhead: time.Millisecond, BlockSize: 16, NumBlocks: 256, MaxNumSeqs: 8,
		MaxBatchTokens: 256, KVBytesPerToken: 1000, KVTransferBytesPerSecond: 1e9}
	w, err := sim.NewWorker(sim.WorkerOptions{Profile: p, Seed: 1, KVRole: role, SideChannel: ln.Addr().String(), PromptTokensDetails: true})
	if err != nil {
		t.Fatal(err)
	}
	s := &seen{}
	srv := &http.Server{Handler: s.wrap(w), ReadHeaderTimeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Runner.Run(ctx); close(done) }()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); cancel(); <-done })
	return w, ln.Addr().String(), s
}

// newPD is a proxy over one prefill worker and one decode worker.
func newPD(t *testing.T, prefillAddr, decodeAddr string) (http.Handler, *router.Router, *metrics.Set) {
	t.Helper()
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{
		{Name: "d", Address: decodeAddr, Models: []string{"m"}, Role: workers.RoleDecode},
		{Name: "p", Address: prefillAddr, Models: []string{"m"}, Role: workers.RolePrefill},
	})
	ms := metrics.NewUnregistered()
	r := router.New(router.Options{Registry: reg, Models: []router.Model{{Name: "m"}}, Metrics: ms})
	return New(Options{Router: r, Config: config.Default().ExtProc, Metrics: ms}), r, ms
}

func serve(h http.Handler, body string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("POST", "/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(rec, req)
	return rec
}

func prompt40() string {
	ids := make([]int, 40)
	for i := range ids {
		ids[i] = i + 1
	}
	b, _ := json.Marshal(ids)
	return string(b)
}

func field(t *testing.T, body, key string) jsonvalue.Value {
	t.Helper()
	v, err := jsonvalue.ParseValue([]byte(body))
	if err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	return v.Field(key)
}

// The two-step exchange with real simulated vLLM workers: the prefill worker gets the
// body vLLM's toy proxy and llm-d's sidecar send (kv_transfer_params do_remote_decode,
// max_tokens 1, stream false, no stream_options), the decode worker the client's body
// with the kv_transfer_params the prefill answered, both one X-Request-Id; the client
// gets the decode worker's stream, whose prompt was read, not prefilled. A client's
// own kv_transfer_params never reach a worker.
func TestProxyRunsThePrefillThenTheDecodeLeg(t *testing.T) {
	pw, paddr, pseen := simWorker(t, sim.KVRoleProducer)
	_, daddr, dseen := simWorker(t, sim.KVRoleConsumer)
	h, r, ms := newPD(t, paddr, daddr)
	body := `{"model":"m","prompt":` + prompt40() + `,"max_tokens":3,"stream":true,"stream_options":{"include_usage":true},` +
		`"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"203.0.113.9","remote_port":1}}`
	rec := serve(h, body)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"cached_tokens":39`) || !strings.Contains(rec.Body.String(), "[DONE]") {
		t.Fatalf("client got %d %s; want the decode worker's stream with 39 prompt tokens read", rec.Code, rec.Body.String())
	}
	pb, pids := pseen.all()
	db, dids := dseen.all()
	if len(pb) != 1 || len(db) != 1 {
		t.Fatalf("prefill saw %d requests, decode %d; want one each", len(pb), len(db))
	}
	const wantKV = `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`
	if got := string(field(t, pb[0], "kv_transfer_params").AppendJSON(nil)); got != wantKV {
		t.Fatalf("prefill kv_transfer_params %s, want %s", got, wantKV)
	}
	if !strings.HasPrefix(pb[0], `{"model":"m","prompt":[1,2,`) || field(t, pb[0], "stream").Boolean() ||
		field(t, pb[0], "max_tokens").Text() != "1" || strings.Contains(pb[0], "stream_options") || strings.Contains(pb[0], "max_completion_tokens") {
		t.Fatalf("prefill body %s: want the client's members in order, stream false, max_tokens 1, no stream_options", pb[0])
	}
	kv := field(t, db[0], "kv_transfer_params")
	if !kv.Field("do_remote_prefill").Boolean() || kv.Field("remote_block_ids").Len() != 3 || kv.Field("remote_port").Text() != strings.Split(paddr, ":")[1] {
		t.Fatalf("decode kv_transfer_params %s: want the prefill worker's answer", kv.AppendJSON(nil))
	}
	if !field(t, db[0], "stream").Boolean() || field(t, db[0], "max_tokens").Text() != "3" || !strings.Contains(db[0], `"stream_options":{"include_usage":true}`) {
		t.Fatalf("decode body %s: want the client's stream, stream_options and max_tokens", db[0])
	}
	if pids[0] == "" || pids[0] != dids[0] {
		t.Fatalf("X-Request-Id prefill %q decode %q: want one id on both legs", pids[0], dids[0])
	}
	if pw.Runner.Stats().HeldRequests != 0 {
		t.Fatal("the decode worker's read must free the prefill worker's blocks")
	}
	if got := testutil.ToFloat64(ms.ExtProc.ProxyPrefillLegs.WithLabelValues("ok")); got != 1 {
		t.Fatalf("prefill legs ok = %v, want 1", got)
	}
	if r.InFlight() != 0 || testutil.ToFloat64(ms.Router.PDFallbacks) != 0 {
		t.Fatalf("in flight %d, fallbacks %v: want both bookings released, no fallback", r.InFlight(), testutil.ToFloat64(ms.Router.PDFallbacks))
	}
}

// A prefill worker that is down, answers an error, or is no kv_producer (no
// kv_transfer_params in its answer): the decode worker prefills locally, the body
// sent unchanged (no kv_transfer_params), counted by result and by the router's
// fallback counter; a refused connection marks the prefill worker unhealthy.
func TestProxyPrefillFailureFallsBackToLocalPrefill(t *testing.T) {
	_, plain, _ := simWorker(t, "") // no KV role: answers without kv_transfer_params
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"message":"boom"}}`, http.StatusServiceUnavailable)
	}))
	t.Cleanup(failing.Close)
	for _, c := range []struct{ name, addr, result string }{
		{"down", deadAddr(t), pdConnect},
		{"error", strings.TrimPrefix(failing.URL, "http://"), pdStatus},
		{"no_params", plain, pdNoKVParams},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, daddr, dseen := simWorker(t, sim.KVRoleConsumer)
			h, r, ms := newPD(t, c.addr, daddr)
			rec := serve(h, `{"model":"m","prompt":`+prompt40()+`,"max_tokens":2}`)
			if rec.Code != 200 || strings.Contains(rec.Body.String(), `"cached_tokens"`) {
				t.Fatalf("client got %d %s; want the decode worker's answer, prefilled locally", rec.Code, rec.Body.String())
			}
			db, _ := dseen.all()
			if len(db) != 1 || strings.Contains(db[0], "kv_transfer_params") {
				t.Fatalf("decode bodies %q: want the request without kv_transfer_params", db)
			}
			if got := testutil.ToFloat64(ms.ExtProc.ProxyPrefillLegs.WithLabelValues(c.result)); got != 1 {
				t.Fatalf("prefill legs %s = %v, want 1", c.result, got)
			}
			if testutil.ToFloat64(ms.Router.PDFallbacks) != 1 || r.InFlight() != 0 {
				t.Fatalf("fallbacks %v, in flight %d", testutil.ToFloat64(ms.Router.PDFallbacks), r.InFlight())
			}
			if healthy := r.Registry().Healthy("p"); healthy == (c.result == pdConnect) {
				t.Fatalf("prefill worker healthy = %v after %s", healthy, c.result)
			}
		})
	}
}

// A client that goes away during the prefill leg cancels it, and the decode leg is
// never sent; both bookings are released.
func TestProxyClientAbortDuringPrefillCancelsBothLegs(t *testing.T) {
	entered, cancelled := make(chan struct{}), make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // net/http sees the client close only once the body is read
		close(entered)
		<-r.Context().Done()
		close(cancelled)
	}))
	t.Cleanup(slow.Close)
	_, daddr, dseen := simWorker(t, sim.KVRoleConsumer)
	h, r, ms := newPD(t, strings.TrimPrefix(slow.URL, "http://"), daddr)
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequest("POST", "/v1/completions", strings.NewReader(`{"model":"m","prompt":`+prompt40()+`}`)).WithContext(ctx)
	done := make(chan struct{})
	go func() { h.ServeHTTP(httptest.NewRecorder(), req); close(done) }()
	<-entered
	cancel()
	<-cancelled
	<-done
	if db, _ := dseen.all(); len(db) != 0 {
		t.Fatalf("decode worker got %d requests after the client left", len(db))
	}
	if r.InFlight() != 0 || testutil.ToFloat64(ms.ExtProc.Aborts.WithLabelValues("client_gone")) != 1 || testutil.ToFloat64(ms.Router.PDFallbacks) != 0 {
		t.Fatalf("in flight %d, aborts %v, fallbacks %v: want the ticket aborted, not a fallback", r.InFlight(),
			testutil.ToFloat64(ms.ExtProc.Aborts.WithLabelValues("client_gone")), testutil.ToFloat64(ms.Router.PDFallbacks))
	}
}

// Without P/D a client's kv_transfer_params are removed: they would make the worker
// read KV from, or hold it for, a host the client names.
func TestProxyStripsClientKVTransferParams(t *testing.T) {
	var got string
	h, _, ms := newProxy(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = string(b)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"text":"x","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
	rec := serve(h, `{"model":"m","prompt":"kv_transfer_params","kv_transfer_params":{"do_remote_prefill":true,"remote_host":"203.0.113.9"},"max_tokens":1}`)
	if rec.Code != 200 || got != `{"model":"m","prompt":"kv_transfer_params","max_tokens":1}` {
		t.Fatalf("worker got %s (status %d), want the body without kv_transfer_params", got, rec.Code)
	}
	if n := testutil.ToFloat64(ms.ExtProc.ClientKVParams.WithLabelValues("proxy", "stripped")); n != 1 {
		t.Fatalf("client_kv_transfer_params_total{proxy,stripped} = %v, want 1", n)
	}
	body := []byte(`{"model":"m","prompt":"say \"kv_transfer_params\""}`)
	if out, _ := request.WithoutKVTransferParams(body, "completions", 0); &out[0] != &body[0] {
		t.Fatal("a body without the member must be forwarded as it is")
	}
}

func TestWithMembersReplacesInPlaceAndAppends(t *testing.T) {
	v, _ := jsonvalue.ParseValue([]byte(`{"a":1,"stream":true,"b":2,"stream_options":{},"c":3}`))
	out := withMembers(v, []jsonvalue.Member{{Key: "stream", Value: jsonvalue.BoolValue(false)}, {Key: "z", Value: jsonvalue.NumberValue("9")}}, "stream_options")
	if got := string(out.AppendJSON(nil)); got != `{"a":1,"stream":false,"b":2,"c":3,"z":9}` {
		t.Fatalf("withMembers = %s", got)
	}
}

// A failed prefill leg is retried once on another prefill worker: the client gets the
// decode worker's answer from the second prefill worker's KV, the legs count the
// failure, the retry and the success, and nothing falls back. A 4xx is not retried.
func TestProxyRetriesAFailedPrefillOnAnotherWorker(t *testing.T) {
	var failingHits atomic.Int32
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		failingHits.Add(1)
		http.Error(w, `{"error":{"message":"boom"}}`, http.StatusInternalServerError)
	}))
	t.Cleanup(failing.Close)
	_, good, pseen := simWorker(t, sim.KVRoleProducer)
	_, daddr, dseen := simWorker(t, sim.KVRoleConsumer)
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{
		{Name: "d", Address: daddr, Models: []string{"m"}, Role: workers.RoleDecode},
		{Name: "p-bad", Address: strings.TrimPrefix(failing.URL, "http://"), Models: []string{"m"}, Role: workers.RolePrefill},
		{Name: "p-good", Address: good, Models: []string{"m"}, Role: workers.RolePrefill},
	})
	// p-bad caches the prompt's first two blocks: the pick prefers it
	ix := kvindex.New(kvindex.Options{})
	toks := make([]uint32, 40)
	for i := range toks {
		toks[i] = uint32(i + 1)
	}
	ix.Store("p-bad", kvindex.TierGPU, kvindex.HashBlocks(kvindex.Namespace{Model: "m"}.Seed(), toks, 16, nil))
	ms := metrics.NewUnregistered()
	r := router.New(router.Options{Registry: reg, Index: ix, Models: []router.Model{{Name: "m", BlockSize: 16}}, Metrics: ms})
	h := New(Options{Router: r, Config: config.Default().ExtProc, Metrics: ms})
	rec := serve(h, `{"model":"m","prompt":`+prompt40()+`,"max_tokens":2}`)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"cached_tokens":39`) {
		t.Fatalf("client got %d %s; want the decode worker's answer from the retried prefill's KV", rec.Code, rec.Body.String())
	}
	if failingHits.Load() != 1 {
		t.Fatalf("the failing prefill worker got %d legs, want 1 (the pick preferred it)", failingHits.Load())
	}
	pb, _ := pseen.all()
	db, _ := dseen.all()
	if len(pb) != 1 || len(db) != 1 || !field(t, db[0], "kv_transfer_params").Field("do_remote_prefill").Boolean() {
		t.Fatalf("retry worker saw %d legs, decode %d (%q); want one each, the decode leg with the retry's kv_transfer_params", len(pb), len(db), db)
	}
	for res, want := range map[string]float64{pdStatus: 1, pdRetry: 1, "ok": 1, pdFallback: 0} {
		if got := testutil.ToFloat64(ms.ExtProc.ProxyPrefillLegs.WithLabelValues(res)); got != want {
			t.Fatalf("prefill legs %s = %v, want %v", res, got, want)
		}
	}
	if testutil.ToFloat64(ms.Router.PDFallbacks) != 0 || r.InFlight() != 0 {
		t.Fatalf("fallbacks %v, in flight %d", testutil.ToFloat64(ms.Router.PDFallbacks), r.InFlight())
	}
	if (&prefillError{Result: pdStatus, Status: 400}).retryable() || !(&prefillError{Result: pdStatus, Status: 503}).retryable() ||
		(&prefillError{Result: pdUnsupportedAPI}).retryable() || !(&prefillError{Result: pdConnect}).retryable() {
		t.Fatal("retryable: want 5xx, connect errors retried; 4xx and unsupported APIs not")
	}
}
