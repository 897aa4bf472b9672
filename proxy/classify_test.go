package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/classify"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring/scoringtest"
	"github.com/kvroute/kvroute/workers"
)

// Through the real proxy with classify rules: a secret in the last user message is
// refused 403 in the request's API shape before admission (the worker never sees it); a
// rule's tag reaches the worker and a client's forged tag never does; a rule's class is
// the admission class; every decision is counted.
func TestProxyClassifyStage(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get(classify.TagHeader))
		mu.Unlock()
		sseWorker().ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "w", Address: strings.TrimPrefix(up.URL, "http://"), Models: []string{"m"}}})
	ms := metrics.NewUnregistered()
	r := router.New(router.Options{Registry: reg, Models: []router.Model{{Name: "m"}}, Metrics: ms, Policy: scoringtest.Busy{}})
	c := config.Default().Admission
	c.Classes = []config.Class{{Name: "batch", Priority: -1, Match: config.ClassMatch{Tenants: []string{"nobody"}}}} // only by the rule
	adm, err := admission.New(admission.Options{Config: c, Metrics: ms})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := classify.Compile([]classify.RuleSpec{
		{Name: "secrets", PII: []string{"aws_access_key", "private_key"}, Refuse: true},
		{Name: "drafts", Regex: `(?i)\bdraft\b`, Tag: true},
		{Name: "reports", Regex: `(?i)\breport\b`, Class: "batch"},
		{Name: "elsewhere", Regex: `\bintegral\b`, Workers: []string{"127.0.0.1:1"}},
		{Name: "here", Regex: `\bderivative\b`, Workers: []string{strings.TrimPrefix(up.URL, "http://")}},
	}, nil, []string{"batch"})
	if err != nil {
		t.Fatal(err)
	}
	rs.Count(ms.Classify)
	pc := config.Default().Proxy
	pc.Paths = append(pc.Paths, "/v1/messages")
	ps := httptest.NewServer(New(Options{Router: r, Config: config.Default().ExtProc, Metrics: ms, Admission: adm, Classify: rs, Proxy: pc}))
	t.Cleanup(ps.Close)
	chat := func(text string) string {
		return `{"model":"m","messages":[{"role":"user","content":"` + text + `"}],"stream":true}`
	}
	forged := map[string]string{classify.TagHeader: "rule=vip"}

	resp, b := admPost(t, ps.URL+"/v1/chat/completions", chat("my key AKIAIOSFODNN7EXAMPLE"), nil)
	if resp.StatusCode != 403 || !strings.Contains(b, `"type":"permission_error"`) || !strings.Contains(b, "secrets") {
		t.Fatalf("OpenAI refusal: %d %s", resp.StatusCode, b)
	}
	resp, b = admPost(t, ps.URL+"/v1/messages", `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"AKIAIOSFODNN7EXAMPLE"}]}`, nil)
	if resp.StatusCode != 403 || !strings.Contains(b, `"type":"error"`) || !strings.Contains(b, `"permission_error"`) {
		t.Fatalf("Anthropic refusal: %d %s", resp.StatusCode, b)
	}
	if resp, b = admPost(t, ps.URL+"/v1/chat/completions", chat("review this Draft"), forged); resp.StatusCode != 200 {
		t.Fatalf("tagged: %d %s", resp.StatusCode, b)
	}
	if resp, b = admPost(t, ps.URL+"/v1/chat/completions", chat("hello"), forged); resp.StatusCode != 200 {
		t.Fatalf("untagged: %d %s", resp.StatusCode, b)
	}
	resp, b = admPost(t, ps.URL+"/v1/chat/completions", chat("the quarterly report"), nil)
	if resp.StatusCode != 200 {
		t.Fatalf("class: %d %s", resp.StatusCode, b)
	}
	if n := testutil.CollectAndCount(ms.Admission.Requests); n == 0 {
		t.Fatal("no admission requests counted")
	}
	if v := testutil.ToFloat64(ms.Admission.Requests.WithLabelValues("unattributed", "batch", "ok")); v != 1 {
		t.Errorf("admission requests{class=batch} = %v, want 1 (the rule's class)", v)
	}
	if resp, b = admPost(t, ps.URL+"/v1/chat/completions", chat("the integral of x"), nil); resp.StatusCode != 503 {
		t.Fatalf("a pool without this worker: %d %s, want 503", resp.StatusCode, b)
	}
	if resp, b = admPost(t, ps.URL+"/v1/chat/completions", chat("the derivative of x"), nil); resp.StatusCode != 200 {
		t.Fatalf("a pool with this worker: %d %s", resp.StatusCode, b)
	}
	mu.Lock()
	got := strings.Join(seen, "|")
	mu.Unlock()
	if got != "rule=drafts|||" {
		t.Fatalf("worker saw tags %q, want the rule's on the first and none after (the forged one stripped)", got)
	}
	for _, c := range []struct {
		rule, action string
		n            float64
	}{{"secrets", "refuse", 2}, {"drafts", "tag", 1}, {"none", "none", 1}, {"reports", "class", 1}, {"elsewhere", "workers", 1}, {"here", "workers", 1}} {
		if v := testutil.ToFloat64(ms.Classify.Decisions.WithLabelValues(c.rule, "none", c.action)); v != c.n {
			t.Errorf("decisions{rule=%s,action=%s} = %v, want %v", c.rule, c.action, v, c.n)
		}
	}
}

// A model rule through the real proxy: the worker of the rewritten model gets the
// request, with the rewritten model in the body it reads (the rest as sent, include_usage
// injected as usual); other requests keep their model and worker; the rewrite is counted.
func TestProxyClassifyModelRewrite(t *testing.T) {
	type got struct{ worker, model, body string }
	var mu sync.Mutex
	var seen []got
	worker := func(name string) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			req, err := request.Parse(request.APIChat, b)
			if err != nil {
				t.Errorf("worker %s: %v", name, err)
				return
			}
			mu.Lock()
			seen = append(seen, got{name, req.Model, string(b)})
			mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(b))
			sseWorker().ServeHTTP(w, r)
		}))
		t.Cleanup(s.Close)
		return s
	}
	big, small := worker("big"), worker("small")
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "big", Address: strings.TrimPrefix(big.URL, "http://"), Models: []string{"big"}},
		{Name: "small", Address: strings.TrimPrefix(small.URL, "http://"), Models: []string{"small"}}})
	ms := metrics.NewUnregistered()
	r := router.New(router.Options{Registry: reg, Models: []router.Model{{Name: "big"}, {Name: "small"}}, Metrics: ms, Policy: scoringtest.Busy{}})
	rs, err := classify.Compile([]classify.RuleSpec{{Name: "greetings", Regex: `(?i)^(hi|hello)\b`, Model: "small", Tag: true}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rs.Count(ms.Classify)
	pc := config.Default().Proxy
	pc.InjectIncludeUsage = true
	ps := httptest.NewServer(New(Options{Router: r, Config: config.Default().ExtProc, Metrics: ms, Classify: rs, Proxy: pc}))
	t.Cleanup(ps.Close)
	for _, text := range []string{"hello, how are you", "prove the Riemann hypothesis"} {
		body := `{"model":"big","messages":[{"role":"user","content":"` + text + `"}],"stream":true,"temperature":0.50}`
		if resp, b := admPost(t, ps.URL+"/v1/chat/completions", body, nil); resp.StatusCode != 200 {
			t.Fatalf("%q: %d %s", text, resp.StatusCode, b)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	want := []got{
		{"small", "small", `{"model":"small","messages":[{"role":"user","content":"hello, how are you"}],"stream":true,"temperature":0.50,"stream_options":{"include_usage":true}}`},
		{"big", "big", `{"model":"big","messages":[{"role":"user","content":"prove the Riemann hypothesis"}],"stream":true,"temperature":0.50,"stream_options":{"include_usage":true}}`},
	}
	if len(seen) != len(want) {
		t.Fatalf("workers saw %+v, want %+v", seen, want)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Errorf("request %d: %+v, want %+v", i, seen[i], want[i])
		}
	}
	if v := testutil.ToFloat64(ms.Classify.Rewrites.WithLabelValues("greetings", "applied")); v != 1 {
		t.Errorf("rewrites{applied} = %v, want 1", v)
	}
	if v := testutil.ToFloat64(ms.Classify.Decisions.WithLabelValues("greetings", "none", "model")); v != 1 {
		t.Errorf("decisions{action=model} = %v, want 1", v)
	}
}

// A remote classifier through the real proxy, against a loopback server in the shape of
// vLLM's POST /classify: a remote label sends the request to its rule's pool, a repeated
// prompt is answered from the cache (the server counts one call), and with the remote
// down a fail-closed rule answers 503 while a fail-open one lets the request through.
func TestProxyClassifyRemote(t *testing.T) {
	var calls atomic.Int64
	var down atomic.Bool
	clf := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		var in struct{ Model, Input string }
		if r.URL.Path != "/classify" || json.NewDecoder(r.Body).Decode(&in) != nil || in.Model != "clf" || down.Load() {
			http.Error(w, `{"error":{"message":"unavailable","type":"ServiceUnavailableError","code":503}}`, 503)
			return
		}
		label, probs := "chat", []float64{0.2, 0.8}
		if strings.Contains(in.Input, "integral") {
			label, probs = "math", []float64{0.95, 0.05}
		}
		json.NewEncoder(w).Encode(map[string]any{"id": "classify-1", "object": "list", "created": 1, "model": in.Model,
			"data":  []map[string]any{{"index": 0, "label": label, "probs": probs, "num_classes": 2}},
			"usage": map[string]int{"prompt_tokens": 3, "total_tokens": 3}})
	}))
	t.Cleanup(clf.Close)
	var mu sync.Mutex
	var seen []string
	worker := func(name string) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			seen = append(seen, name)
			mu.Unlock()
			sseWorker().ServeHTTP(w, r)
		}))
		t.Cleanup(s.Close)
		return strings.TrimPrefix(s.URL, "http://")
	}
	general, stem := worker("general"), worker("stem")
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "general", Address: general, Models: []string{"m"}}, {Name: "stem", Address: stem, Models: []string{"m"}}})
	ms := metrics.NewUnregistered()
	r := router.New(router.Options{Registry: reg, Models: []router.Model{{Name: "m"}}, Metrics: ms, Policy: scoringtest.Busy{}})
	remote, err := classify.NewRemote(classify.RemoteOptions{URL: clf.URL + "/classify", Model: "clf", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	remote.Count(ms.Classify)
	rs, err := classify.CompileWith([]classify.RuleSpec{
		{Name: "audited", Regex: `(?i)\baudit\b`, RemoteLabels: []string{"math"}, RemoteFail: "closed", Tag: true},
		{Name: "stem", RemoteLabels: []string{"math"}, MinConfidence: 0.9, Workers: []string{stem}},
		{Name: "rest", Regex: ".", Workers: []string{general}},
	}, classify.Classifiers{Remote: remote}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rs.Count(ms.Classify)
	ps := httptest.NewServer(New(Options{Router: r, Config: config.Default().ExtProc, Metrics: ms, Classify: rs}))
	t.Cleanup(ps.Close)
	chat := func(text string) string {
		return `{"model":"m","messages":[{"role":"user","content":"` + text + `"}],"stream":true}`
	}
	for _, text := range []string{"the integral of x", "the integral of x", "tell me a joke"} {
		if resp, b := admPost(t, ps.URL+"/v1/chat/completions", chat(text), nil); resp.StatusCode != 200 {
			t.Fatalf("%q: %d %s", text, resp.StatusCode, b)
		}
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("classifier called %d times, want 2 (the repeated prompt from the cache)", n)
	}
	down.Store(true)
	resp, b := admPost(t, ps.URL+"/v1/chat/completions", chat("audit this integral"), nil)
	if resp.StatusCode != 503 || !strings.Contains(b, "audited") {
		t.Fatalf("fail closed: %d %s, want 503 naming the rule", resp.StatusCode, b)
	}
	if resp, b = admPost(t, ps.URL+"/v1/chat/completions", chat("another integral"), nil); resp.StatusCode != 200 {
		t.Fatalf("fail open: %d %s", resp.StatusCode, b)
	}
	mu.Lock()
	got := strings.Join(seen, ",")
	mu.Unlock()
	if got != "stem,stem,general,general" {
		t.Fatalf("workers %s, want stem,stem,general,general (math to its pool; a failed remote falls through to the next rule)", got)
	}
	for outcome, n := range map[string]float64{"ok": 2, "cached": 1, "error": 2} {
		if v := testutil.ToFloat64(ms.Classify.RemoteRequests.WithLabelValues(outcome)); v != n {
			t.Errorf("remote_requests{outcome=%s} = %v, want %v", outcome, v, n)
		}
	}
}
