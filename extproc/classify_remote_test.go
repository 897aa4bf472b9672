package extproc

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/classify"
	"github.com/kvroute/kvroute/config"
)

// remoteDouble is a real loopback HTTP server in the documented shape of vLLM's pooling
// endpoint POST /classify, the API classify.Remote speaks
// (vllm/entrypoints/pooling/classify/protocol.py): {"model", "input"} in, {"id",
// "object": "list", "model", "data": [{"index", "label", "probs", "num_classes"}],
// "usage"} out, 400 for another path, method or model. The label is "math" (probs
// 0.9/0.1) when the input says "integral", else "other" (0.3/0.7). fail set answers 500.
// It mirrors classify's own double (classify/remote_test.go), which this package
// cannot import.
type remoteDouble struct {
	srv   *httptest.Server
	calls atomic.Int64
	fail  atomic.Bool
	mu    sync.Mutex
	input []string // every well-formed request's input, in order
}

const remoteModel = "clf"

func newRemoteDouble(t *testing.T) *remoteDouble {
	d := &remoteDouble{}
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.calls.Add(1)
		var in struct {
			Model string `json:"model"`
			Input string `json:"input"`
		}
		if r.URL.Path != "/classify" || r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" ||
			json.NewDecoder(r.Body).Decode(&in) != nil || in.Model != remoteModel {
			http.Error(w, `{"error":{"message":"bad request","type":"BadRequestError","code":400}}`, http.StatusBadRequest)
			return
		}
		d.mu.Lock()
		d.input = append(d.input, in.Input)
		d.mu.Unlock()
		if d.fail.Load() {
			http.Error(w, `{"error":{"message":"engine dead","type":"InternalServerError","code":500}}`, http.StatusInternalServerError)
			return
		}
		label, probs := "other", []float64{0.3, 0.7}
		if strings.Contains(in.Input, "integral") {
			label, probs = "math", []float64{0.9, 0.1}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"id": "classify-1", "object": "list", "created": 1, "model": in.Model,
			"data":  []map[string]any{{"index": 0, "label": label, "probs": probs, "num_classes": 2}},
			"usage": map[string]int{"prompt_tokens": 5, "total_tokens": 5, "completion_tokens": 0}})
	}))
	t.Cleanup(d.srv.Close)
	return d
}

func (d *remoteDouble) inputs() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.input)
}

// remoteHarness is the ext_proc harness with a classify stage built from config the
// way the app builds it (config.ClassifyRemote → classify.NewRemote, counted in the
// harness's metrics; config.ClassifyRule → classify.CompileWith). The remote's timeout
// is a minute: a test asserts what the server answers, not how soon.
func remoteHarness(t *testing.T, d *remoteDouble, rules ...config.ClassifyRule) *harness {
	h := newHarness(t)
	rc := config.Default().Classify.Remote
	rc.URL, rc.Model, rc.Timeout = d.srv.URL+"/classify", remoteModel, time.Minute
	remote, err := classify.NewRemote(classify.RemoteOptions{URL: rc.URL, Model: rc.Model, Timeout: rc.Timeout,
		MaxConcurrent: rc.MaxConcurrency, CacheEntries: rc.CacheSize, MaxInputBytes: rc.MaxInputBytes})
	if err != nil {
		t.Fatal(err)
	}
	remote.Count(h.ms.Classify)
	rs, err := classify.CompileWith(rules, classify.Classifiers{Remote: remote}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rs.Count(h.ms.Classify)
	h.srv.opt.Classify = rs
	return h
}

// stemRule routes what the remote calls math to w2 and tags it; fail is its remote_fail.
func stemRule(fail string) config.ClassifyRule {
	return config.ClassifyRule{Name: "stem", RemoteLabels: []string{"math"}, MinConfidence: 0.8, RemoteFail: fail,
		Workers: []string{"10.0.0.2:8000"}, Tag: true}
}

func remoteCount(t *testing.T, h *harness, outcome string) float64 {
	t.Helper()
	return testutil.ToFloat64(h.ms.Classify.RemoteRequests.WithLabelValues(outcome))
}

// Envoy BUFFERED request body mode (request_headers answered with a bare continue, then
// the whole request_body, whose reply carries the header mutations Envoy applies while
// it still holds the headers): the remote classifier's label decides the rule. "math"
// (0.9 ≥ min_confidence 0.8) gives the rule's pool — the destination header is w2 on
// every pick though both workers are idle — and the tag header naming the remote label;
// "other" matches no rule, so the pick is free and a client's forged tag is removed.
// The double saw the last user message as input, with the configured model.
func TestExtProcRemoteLabelsDriveRule(t *testing.T) {
	d := newRemoteDouble(t)
	h := remoteHarness(t, d, stemRule("open"))
	dest := config.Default().ExtProc.DestinationHeader
	for i, text := range []string{"the integral of x", "an integral of y", "the integral of z"} {
		r := bufferedPick(t, h, "/v1/chat/completions", chatWith(text), classify.TagHeader, "rule=vip")
		if r.GetImmediateResponse() != nil {
			t.Fatalf("pick %d: immediate response %v", i, r.GetImmediateResponse())
		}
		mut := r.GetRequestBody().GetResponse().GetHeaderMutation()
		if got := destOf(t, mut, dest); got != "10.0.0.2:8000" {
			t.Fatalf("pick %d: destination %q, want the rule's worker 10.0.0.2:8000", i, got)
		}
		if got := destOf(t, mut, classify.TagHeader); got != "rule=stem; remote_label=math" {
			t.Fatalf("pick %d: tag header %q", i, got)
		}
	}
	mut := bufferedPick(t, h, "/v1/chat/completions", chatWith("hello"), classify.TagHeader, "rule=vip").GetRequestBody().GetResponse().GetHeaderMutation()
	if got := destOf(t, mut, dest); got != "10.0.0.1:8000" && got != "10.0.0.2:8000" {
		t.Fatalf("unmatched request: destination %q, want one of the model's workers", got)
	}
	if got := destOf(t, mut, classify.TagHeader); got != "" || !slices.Contains(mut.GetRemoveHeaders(), classify.TagHeader) {
		t.Fatalf("unmatched request: tag %q, remove_headers %v; want no tag and the forged one removed", got, mut.GetRemoveHeaders())
	}
	want := []string{"the integral of x", "an integral of y", "the integral of z", "hello"}
	if got := d.inputs(); !slices.Equal(got, want) {
		t.Fatalf("remote inputs %q, want %q", got, want)
	}
	if v := testutil.ToFloat64(h.ms.Classify.Decisions.WithLabelValues("stem", "none", "workers")); v != 3 {
		t.Errorf("decisions{stem,workers} = %v, want 3", v)
	}
	if v := testutil.ToFloat64(h.ms.Classify.Decisions.WithLabelValues("none", "none", "none")); v != 1 {
		t.Errorf("decisions{none} = %v, want 1", v)
	}
	if v := remoteCount(t, h, "ok"); v != 4 {
		t.Errorf("remote_requests{ok} = %v, want 4", v)
	}
}

// A remote_fail open rule whose remote classifier fails — a 500 from a live server,
// then no server at all (closed: connection refused) — gives no label, so the rule does
// not match: in BUFFERED mode the request_body reply is a normal continue with a
// destination (no immediate_response, so Envoy forwards the request) and no tag.
func TestExtProcRemoteFailOpen(t *testing.T) {
	d := newRemoteDouble(t)
	h := remoteHarness(t, d, stemRule("open"))
	dest := config.Default().ExtProc.DestinationHeader
	check := func(how, text string) {
		t.Helper()
		r := bufferedPick(t, h, "/v1/chat/completions", chatWith(text))
		if ir := r.GetImmediateResponse(); ir != nil {
			t.Fatalf("%s: immediate response %v %s, want the request routed", how, ir.GetStatus(), ir.GetBody())
		}
		mut := r.GetRequestBody().GetResponse().GetHeaderMutation()
		if got := destOf(t, mut, dest); got != "10.0.0.1:8000" && got != "10.0.0.2:8000" {
			t.Fatalf("%s: destination %q, want one of the model's workers", how, got)
		}
		if got := destOf(t, mut, classify.TagHeader); got != "" {
			t.Fatalf("%s: tag %q, want none (no remote label)", how, got)
		}
	}
	d.fail.Store(true)
	check("500", "the integral of x")
	if n := d.calls.Load(); n != 1 {
		t.Fatalf("%d calls, want 1", n)
	}
	d.srv.Close()
	check("closed", "the integral of y")
	if v := remoteCount(t, h, "error"); v != 2 {
		t.Errorf("remote_requests{error} = %v, want 2", v)
	}
	if v := testutil.ToFloat64(h.ms.Classify.Decisions.WithLabelValues("none", "none", "none")); v != 2 {
		t.Errorf("decisions{none} = %v, want 2", v)
	}
	if v := testutil.ToFloat64(h.ms.ExtProc.ImmediateResponses.WithLabelValues("503")); v != 0 {
		t.Errorf("immediate_responses{503} = %v, want 0", v)
	}
}

// The same failures with remote_fail closed: the request_body reply in BUFFERED mode is
// an immediate_response (Envoy sends it as the local reply and stops processing the
// stream) with status 503, content-type application/json, details
// kvroute_classify_unavailable (Envoy's %RESPONSE_CODE_DETAILS%), and the error JSON in
// the request's API shape: OpenAI's {"error":{"message","type"}} naming the remote
// classifier and the rule, and on /v1/messages Anthropic's {"type":"error","error":
// {"type":"overloaded_error",…}}. No worker is booked.
func TestExtProcRemoteFailClosed(t *testing.T) {
	d := newRemoteDouble(t)
	h := remoteHarness(t, d, stemRule("closed"))
	d.fail.Store(true)
	check := func(how, path, b string) map[string]any {
		t.Helper()
		r := bufferedPick(t, h, path, b)
		ir := r.GetImmediateResponse()
		if ir == nil {
			t.Fatalf("%s: %v, want an immediate response", how, r)
		}
		if ir.GetStatus().GetCode() != http.StatusServiceUnavailable || ir.GetDetails() != "kvroute_classify_unavailable" {
			t.Fatalf("%s: status %v details %q, want 503 kvroute_classify_unavailable", how, ir.GetStatus(), ir.GetDetails())
		}
		if got := destOf(t, ir.GetHeaders(), "content-type"); got != "application/json" {
			t.Fatalf("%s: content-type %q", how, got)
		}
		var doc map[string]any
		if err := json.Unmarshal(ir.GetBody(), &doc); err != nil {
			t.Fatalf("%s: body %q: %v", how, ir.GetBody(), err)
		}
		return doc
	}
	openAI := func(how string, doc map[string]any) {
		t.Helper()
		e, _ := doc["error"].(map[string]any)
		msg, _ := e["message"].(string)
		typ, _ := e["type"].(string)
		if typ != "service_unavailable" || !strings.Contains(msg, "remote classifier") || !strings.Contains(msg, "stem") {
			t.Fatalf("%s: error %v, want type service_unavailable and a message naming the remote classifier and rule stem", how, doc)
		}
	}
	openAI("500", check("500", "/v1/chat/completions", chatWith("the integral of x")))
	doc := check("anthropic", "/v1/messages", `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"an integral"}]}`)
	if e, _ := doc["error"].(map[string]any); doc["type"] != "error" || e["type"] != "overloaded_error" || !strings.Contains(e["message"].(string), "remote classifier") {
		t.Fatalf("anthropic: %v", doc)
	}
	d.srv.Close()
	openAI("closed", check("closed", "/v1/chat/completions", chatWith("the integral of y")))
	if v := testutil.ToFloat64(h.ms.ExtProc.ImmediateResponses.WithLabelValues("503")); v != 3 {
		t.Errorf("immediate_responses{503} = %v, want 3", v)
	}
	if v := testutil.ToFloat64(h.ms.Classify.Decisions.WithLabelValues("stem", "none", "unavailable")); v != 3 {
		t.Errorf("decisions{stem,unavailable} = %v, want 3", v)
	}
	if n := h.router.InFlight(); n != 0 {
		t.Errorf("%d requests booked on workers, want 0", n)
	}
}

// The same prompt on two ext_proc streams (two requests, each BUFFERED: request_headers
// then request_body): the second is answered from the remote's cache — the double
// counted exactly one call — and its request_body reply carries the same destination
// and tag as the first.
func TestExtProcRemoteCacheHit(t *testing.T) {
	d := newRemoteDouble(t)
	h := remoteHarness(t, d, stemRule("closed"))
	dest := config.Default().ExtProc.DestinationHeader
	var got [2][2]string
	for i := range got {
		mut := bufferedPick(t, h, "/v1/chat/completions", chatWith("the integral of x")).GetRequestBody().GetResponse().GetHeaderMutation()
		got[i] = [2]string{destOf(t, mut, dest), destOf(t, mut, classify.TagHeader)}
	}
	if want := [2]string{"10.0.0.2:8000", "rule=stem; remote_label=math"}; got[0] != want || got[1] != want {
		t.Fatalf("destination and tag %q, want %q twice", got, want)
	}
	if n := d.calls.Load(); n != 1 {
		t.Fatalf("the double counted %d calls, want 1 (the second answered by the cache)", n)
	}
	if ok, cached := remoteCount(t, h, "ok"), remoteCount(t, h, "cached"); ok != 1 || cached != 1 {
		t.Errorf("remote_requests ok %v cached %v, want 1 and 1", ok, cached)
	}
}
