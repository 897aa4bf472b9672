package tokenize

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
)

// fakeWorker is a vLLM /tokenize stand-in on 127.0.0.1. mode: "ok" answers tokens,
// "500" fails, "hang" blocks until the client gives up.
type fakeWorker struct {
	srv   *httptest.Server
	mode  atomic.Value
	calls atomic.Int64
	last  atomic.Value  // map[string]any: the last request body
	hung  chan struct{} // receives when a "hang" request has arrived
}

func newFakeWorker(t *testing.T) *fakeWorker {
	t.Helper()
	f := &fakeWorker{hung: make(chan struct{}, 1)}
	f.mode.Store("ok")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.srv = &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.calls.Add(1)
		if r.Method != http.MethodPost || r.URL.Path != "/tokenize" {
			http.NotFound(w, r)
			return
		}
		var body map[string]any
		b, _ := io.ReadAll(r.Body)
		json.Unmarshal(b, &body)
		f.last.Store(body)
		switch f.mode.Load().(string) {
		case "500":
			http.Error(w, `{"error":"boom"}`, http.StatusInternalServerError)
		case "400":
			http.Error(w, `{"error":{"message":"Conversation roles must alternate","type":"BadRequestError","code":400}}`, http.StatusBadRequest)
		case "hang":
			select {
			case f.hung <- struct{}{}:
			default:
			}
			<-r.Context().Done()
		case "garbage":
			w.Write([]byte(`{"tokens":"nope"`))
		case "miscount":
			w.Write([]byte(`{"count":9,"tokens":[1,2]}`))
		default:
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"count":4,"max_model_len":4096,"tokens":[1,2,3,4]}`))
		}
	})}}
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeWorker) addr() string { return f.srv.Listener.Addr().String() }

func chatReq(model string) *request.Request {
	r, err := request.Parse(request.APIChat, []byte(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}],
		"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}`))
	if err != nil {
		panic(err)
	}
	return r
}

// TestFallbackChain: a model whose local tokenizer is missing is served by a worker's
// /tokenize; when that fails (error status, timeout, no worker) the request is
// degraded. Each step must be visible in the metrics.
func TestFallbackChain(t *testing.T) {
	w := newFakeWorker(t)
	addr := w.addr()
	ms := metrics.NewUnregistered().Tokenize
	s, err := NewService(ServiceOptions{
		Models: []ModelConfig{{Name: "m", Tokenizer: filepath.Join(t.TempDir(), "absent"), RemoteTimeout: 50 * time.Millisecond}},
		Address: func(model string) (string, bool) {
			return addr, addr != ""
		},
		Metrics:       ms,
		Logger:        slog.New(slog.DiscardHandler),
		RemoteBackoff: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(ms.LocalAvailable.WithLabelValues("m")); got != 0 {
		t.Errorf("local_available = %v, want 0 for a missing tokenizer directory", got)
	}

	// 1. local missing → remote answers.
	res, err := s.Tokenize(context.Background(), chatReq("m"))
	if err != nil || res.Path != PathRemote || len(res.Tokens) != 4 || res.PromptTokens != 4 {
		t.Fatalf("local missing: got %+v, %v; want the remote path with the worker's 4 ids", res, err)
	}
	body := w.last.Load().(map[string]any)
	if body["model"] != "m" || body["messages"] == nil || body["tools"] == nil {
		t.Errorf("remote /tokenize body must carry model, messages and tools (vLLM chat form), got %v", body)
	}
	if got := testutil.ToFloat64(ms.Failures.WithLabelValues("m", "local", ReasonNoTokenizer)); got != 1 {
		t.Errorf("failures{local,no_tokenizer} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(ms.Requests.WithLabelValues("m", "remote")); got != 1 {
		t.Errorf("requests{remote} = %v, want 1", got)
	}

	// 2. the worker fails → degraded.
	w.mode.Store("500")
	res, _ = s.Tokenize(context.Background(), chatReq("m"))
	if res.Path != PathNone || res.Degraded != "remote_"+ReasonHTTP || res.Tokens != nil {
		t.Fatalf("worker 500: got %+v, want PathNone degraded remote_http_status", res)
	}
	if got := testutil.ToFloat64(ms.Degraded.WithLabelValues("m", "remote_"+ReasonHTTP)); got != 1 {
		t.Errorf("degraded{remote_http_status} = %v, want 1", got)
	}

	// 3. the worker hangs → the remote timeout bounds the wait.
	w.mode.Store("hang")
	start := time.Now()
	res, _ = s.Tokenize(context.Background(), chatReq("m"))
	if res.Path != PathNone || res.Degraded != "remote_"+ReasonTimeout {
		t.Fatalf("worker hangs: got %+v, want degraded remote_timeout", res)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("remote timeout of 50ms took %v", el)
	}

	// 4. no worker address → degraded no_worker.
	addr = ""
	res, _ = s.Tokenize(context.Background(), chatReq("m"))
	if res.Degraded != "remote_"+ReasonNoWorker {
		t.Fatalf("no worker: got %+v, want degraded remote_no_worker", res)
	}
	if got := testutil.ToFloat64(ms.Requests.WithLabelValues("m", "none")); got != 3 {
		t.Errorf("requests{none} = %v, want 3", got)
	}

	// Health shows both paths with their last reasons.
	h := s.Health()
	if len(h) != 1 || len(h[0].Paths) != 2 || h[0].Paths[0].Path != PathLocal || h[0].Paths[0].Available {
		t.Fatalf("health: %+v", h)
	}
	if p := h[0].Paths[1]; p.Successes != 1 || p.Failures != 3 || p.LastReason != ReasonNoWorker {
		t.Errorf("remote health = %+v, want 1 success, 3 failures, last no_worker", p)
	}
}

func TestServiceGivenAndUnknown(t *testing.T) {
	ms := metrics.NewUnregistered().Tokenize
	s, err := NewService(ServiceOptions{Models: []ModelConfig{{Name: "m", Paths: []Path{PathRemote}}}, Metrics: ms, RemoteBackoff: -1})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := request.Parse(request.APICompletions, []byte(`{"model":"m","prompt":[[5,6,7],[8]]}`))
	res, _ := s.Tokenize(context.Background(), r)
	if res.Path != PathGiven || len(res.Tokens) != 3 || res.PromptTokens != 4 {
		t.Errorf("token-id prompt: got %+v, want PathGiven with the first prompt and 4 tokens in all", res)
	}
	res, _ = s.Tokenize(context.Background(), chatReq("nope"))
	if res.Path != PathNone || res.Degraded != ReasonUnknown {
		t.Errorf("unknown model: got %+v", res)
	}
	if got := testutil.ToFloat64(ms.Degraded.WithLabelValues("other", ReasonUnknown)); got != 1 {
		t.Errorf("degraded{other,unknown_model} = %v (client model names must not become labels)", got)
	}
	// Remote path without an address function.
	res, _ = s.Tokenize(context.Background(), chatReq("m"))
	if res.Degraded != "remote_"+ReasonNoWorker {
		t.Errorf("no address function: got %+v", res)
	}
}

func TestServiceConfigErrors(t *testing.T) {
	for _, mcs := range [][]ModelConfig{
		{{Name: "m", Paths: []Path{"magic"}}},
		{{Name: "m", Paths: []Path{PathLocal, PathLocal}}},
		{{Name: "m"}, {Name: "m"}},
	} {
		if _, err := NewService(ServiceOptions{Models: mcs}); err == nil {
			t.Errorf("NewService(%+v) accepted an invalid configuration", mcs)
		}
	}
}

// TestServiceLocal: the local path gives exactly RenderChat + EncodeText, completions
// get add_special_tokens=true by default, and the canceled context stops the chain.
func TestServiceLocal(t *testing.T) {
	m := loadFamily(t, "llama3_1")
	ms := metrics.NewUnregistered().Tokenize
	s, err := NewService(ServiceOptions{Models: []ModelConfig{{Name: "lora", Base: "l"}, {Name: "l", Model: m}}, Metrics: ms})
	if err != nil {
		t.Fatal(err)
	}
	req := chatReq("l")
	res, _ := s.Tokenize(context.Background(), req)
	text, err := m.RenderChat(req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Path != PathLocal || firstDiff(res.Tokens, m.EncodeText(text, false)) >= 0 {
		t.Fatalf("local chat: got %+v", res)
	}
	r, _ := request.Parse(request.APICompletions, []byte(`{"model":"lora","prompt":["Hello world","x"]}`))
	res, _ = s.Tokenize(context.Background(), r)
	if res.Path != PathLocal || res.Tokens[0] != 128000 || res.PromptTokens != len(res.Tokens)+2 {
		t.Errorf("completions: got %+v, want BOS first (Llama 3.1 post-processor) and both prompts counted", res)
	}
	no := false
	r.AddSpecialTokens = &no
	res, _ = s.Tokenize(context.Background(), r)
	if res.Tokens[0] == 128000 {
		t.Errorf("add_special_tokens=false must not add BOS: %v", res.Tokens)
	}
	if got := testutil.ToFloat64(ms.Requests.WithLabelValues("lora", "local")); got != 2 {
		t.Errorf("requests{lora,local} = %v, want 2", got)
	}
	// Image parts cannot be rendered locally: counted as unsupported_content.
	img, _ := request.Parse(request.APIChat, []byte(`{"model":"l","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`))
	res, _ = s.Tokenize(context.Background(), img)
	if res.Path != PathNone || res.Degraded != "remote_no_worker" {
		t.Errorf("image content: got %+v", res)
	}
	if got := testutil.ToFloat64(ms.Failures.WithLabelValues("l", "local", ReasonContent)); got != 1 {
		t.Errorf("failures{local,unsupported_content} = %v, want 1", got)
	}
}

// TestRemoteFailures: every way a worker's /tokenize can fail is classified.
func TestRemoteFailures(t *testing.T) {
	w := newFakeWorker(t)
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closedAddr := closed.Addr().String()
	closed.Close()
	addr := w.addr()
	ms := metrics.NewUnregistered().Tokenize
	s, err := NewService(ServiceOptions{Models: []ModelConfig{{Name: "m", Paths: []Path{PathRemote}, RemoteTimeout: time.Second}},
		Address: func(string) (string, bool) { return addr, true }, Metrics: ms, RemoteBackoff: -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ mode, reason string }{{"garbage", ReasonDecode}, {"miscount", ReasonDecode}} {
		w.mode.Store(c.mode)
		if res, _ := s.Tokenize(context.Background(), chatReq("m")); res.Degraded != "remote_"+c.reason {
			t.Errorf("worker answers %s: got %+v, want remote_%s", c.mode, res, c.reason)
		}
	}
	addr = closedAddr
	if res, _ := s.Tokenize(context.Background(), chatReq("m")); res.Degraded != "remote_"+ReasonTransport {
		t.Errorf("connection refused: got %+v, want remote_transport", res)
	}
	addr = w.addr()
	w.mode.Store("hang")
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-w.hung // the call is in flight at the worker
		cancel()
	}()
	if res, _ := s.Tokenize(ctx, chatReq("m")); res.Degraded != ReasonCanceled {
		t.Errorf("caller canceled: got %+v, want canceled", res)
	}
	// Completions: one /tokenize call per prompt, ids of the first, count of all.
	w.mode.Store("ok")
	r, _ := request.Parse(request.APICompletions, []byte(`{"model":"m","prompt":["a","b"],"add_special_tokens":false}`))
	before := w.calls.Load()
	res, _ := s.Tokenize(context.Background(), r)
	if res.Path != PathRemote || res.PromptTokens != 8 || w.calls.Load()-before != 2 {
		t.Errorf("completions remote: got %+v after %d calls, want 8 tokens from 2 calls", res, w.calls.Load()-before)
	}
	if body := w.last.Load().(map[string]any); body["prompt"] != "b" || body["add_special_tokens"] != false {
		t.Errorf("completion form body = %v, want prompt and add_special_tokens", body)
	}
	if got := testutil.ToFloat64(ms.Failures.WithLabelValues("m", "remote", ReasonDecode)); got != 2 {
		t.Errorf("failures{remote,bad_response} = %v, want 2", got)
	}
}

// TestRemoteBackoff: after 3 consecutive worker failures the remote path is skipped for
// the backoff period (no round trip per request), then tried again.
func TestRemoteBackoff(t *testing.T) {
	w := newFakeWorker(t)
	w.mode.Store("500")
	now := time.Unix(1000, 0)
	ms := metrics.NewUnregistered().Tokenize
	s, err := NewService(ServiceOptions{Models: []ModelConfig{{Name: "m", Paths: []Path{PathRemote}}},
		Address: func(string) (string, bool) { return w.addr(), true }, Metrics: ms,
		Now: func() time.Time { return now }, RemoteBackoff: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		s.Tokenize(context.Background(), chatReq("m"))
	}
	if w.calls.Load() != 3 {
		t.Fatalf("calls = %d, want 3", w.calls.Load())
	}
	res, _ := s.Tokenize(context.Background(), chatReq("m"))
	if res.Degraded != "remote_"+ReasonBackoff || w.calls.Load() != 3 {
		t.Errorf("in backoff: got %+v after %d calls, want remote_backoff and no call", res, w.calls.Load())
	}
	now = now.Add(11 * time.Second)
	w.mode.Store("ok")
	if res, _ := s.Tokenize(context.Background(), chatReq("m")); res.Path != PathRemote {
		t.Errorf("after the backoff: got %+v, want the remote path again", res)
	}
	if got := testutil.ToFloat64(ms.Failures.WithLabelValues("m", "remote", ReasonBackoff)); got != 1 {
		t.Errorf("failures{remote,backoff} = %v, want 1", got)
	}
}

// TestRemoteClientError (issue 11 item 12): a 4xx from a worker's /tokenize is the
// request's fault (e.g. a chat the template refuses): the request is degraded with
// reason client_error, no other worker is asked, and no backoff starts, so the next
// requests still use the remote path. Before, three 400s put the model's remote path
// in backoff.
func TestRemoteClientError(t *testing.T) {
	w1, w2 := newFakeWorker(t), newFakeWorker(t)
	w1.mode.Store("400")
	w2.mode.Store("400")
	ms := metrics.NewUnregistered().Tokenize
	var n atomic.Int64
	s, err := NewService(ServiceOptions{Models: []ModelConfig{{Name: "m", Paths: []Path{PathRemote}}},
		Address: func(string) (string, bool) {
			if n.Add(1)%2 == 0 {
				return w2.addr(), true
			}
			return w1.addr(), true
		}, Metrics: ms, RemoteBackoff: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		res, _ := s.Tokenize(context.Background(), chatReq("m"))
		if res.Path != PathNone || res.Degraded != "remote_"+ReasonClient {
			t.Errorf("request %d: %+v, want degraded remote_client_error", i, res)
		}
	}
	if got := w1.calls.Load() + w2.calls.Load(); got != 5 {
		t.Errorf("workers asked %d times for 5 requests, want 5 (no backoff, no second worker for a client error)", got)
	}
	w1.mode.Store("ok")
	w2.mode.Store("ok")
	if res, _ := s.Tokenize(context.Background(), chatReq("m")); res.Path != PathRemote {
		t.Errorf("after client errors: %+v, want the remote path", res)
	}
}

// TestShadowRateCap: the shadow check is capped per model (a token bucket of
// MaxPerSecond, burst of one second's worth), off when Fraction is negative, and only
// checks requests the local path served.
func TestShadowRateCap(t *testing.T) {
	w := newFakeWorker(t) // answers [1 2 3 4]
	now := time.Unix(1000, 0)
	ms := metrics.NewUnregistered().Tokenize
	dir := t.TempDir()
	writeTiny(t, dir, nil)
	m, err := LoadModel(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewService(ServiceOptions{Models: []ModelConfig{{Name: "m", Model: m}}, Metrics: ms,
		Address: func(string) (string, bool) { return w.addr(), true },
		Now:     func() time.Time { return now }, Shadow: ShadowOptions{Fraction: 1, MaxPerSecond: 2, Concurrency: 100}})
	if err != nil {
		t.Fatal(err)
	}
	req := chatReq("m")
	for range 10 {
		s.Shadow(req, PathLocal, []uint32{1, 2, 3, 4}, w.addr())
	}
	s.Shadow(req, PathRemote, []uint32{1, 2, 3, 4}, w.addr()) // not a local result: never checked
	s.WaitShadow()
	if got := testutil.ToFloat64(ms.ShadowChecks.WithLabelValues("m", ShadowMatch)); got != 2 {
		t.Errorf("10 requests at one instant with max_per_second 2: %v checks, want 2", got)
	}
	now = now.Add(time.Second)
	for range 10 {
		s.Shadow(req, PathLocal, []uint32{1, 2, 3, 9}, w.addr())
	}
	s.WaitShadow()
	if got := testutil.ToFloat64(ms.ShadowChecks.WithLabelValues("m", ShadowMismatch)); got != 2 {
		t.Errorf("one second later: %v mismatches, want 2", got)
	}
	if h := s.Health()[0].Shadow; h.Remote || h.LastDiffPos != 3 {
		t.Errorf("2 mismatches of 4 checks (min_checks 20): %+v, want not switched, diff at 3", h)
	}

	off, err := NewService(ServiceOptions{Models: []ModelConfig{{Name: "m", Model: m}}, Metrics: metrics.NewUnregistered().Tokenize,
		Address: func(string) (string, bool) { return w.addr(), true }, Shadow: ShadowOptions{Fraction: -1}})
	if err != nil {
		t.Fatal(err)
	}
	before := w.calls.Load()
	off.Shadow(req, PathLocal, []uint32{1}, w.addr())
	off.WaitShadow()
	if w.calls.Load() != before || off.Health()[0].Shadow.Enabled {
		t.Errorf("fraction -1: the worker was asked (%d calls) or the check shows enabled", w.calls.Load()-before)
	}
}
