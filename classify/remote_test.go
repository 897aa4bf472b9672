package classify

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// classifyDouble is an HTTP server in the documented shape of vLLM's POST /classify
// (vllm/entrypoints/pooling/classify/protocol.py): {"model", "input"} in,
// {"id", "object": "list", "model", "data": [{"index", "label", "probs", "num_classes"}],
// "usage"} out; 400 for a wrong model, as vLLM answers an unknown model. The label is
// "math" when the input says "integral", else "other". mode switches failures on.
type classifyDouble struct {
	srv   *httptest.Server
	calls atomic.Int64
	mode  atomic.Value // "", "500", "garbage", "huge", "block"
	block chan struct{}
}

func newClassifyDouble(t *testing.T) *classifyDouble {
	d := &classifyDouble{block: make(chan struct{})}
	d.mode.Store("")
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.calls.Add(1)
		var in struct {
			Model string `json:"model"`
			Input string `json:"input"`
		}
		if r.URL.Path != "/classify" || r.Method != http.MethodPost || json.NewDecoder(r.Body).Decode(&in) != nil || in.Model != "clf" {
			http.Error(w, `{"error":{"message":"bad request","type":"BadRequestError","code":400}}`, 400)
			return
		}
		switch d.mode.Load().(string) {
		case "500":
			http.Error(w, "boom", 500)
			return
		case "garbage":
			w.Write([]byte(`{"data": [`))
			return
		case "huge":
			w.Write([]byte(`{"data":[{"label":"` + strings.Repeat("x", maxRemoteReply) + `"}]}`))
			return
		case "block":
			select {
			case <-d.block:
			case <-r.Context().Done():
			}
		}
		label, probs := "other", []float64{0.3, 0.7}
		if strings.Contains(in.Input, "integral") {
			label, probs = "math", []float64{0.9, 0.1}
		}
		json.NewEncoder(w).Encode(map[string]any{"id": "classify-1", "object": "list", "created": 1, "model": in.Model,
			"data":  []map[string]any{{"index": 0, "label": label, "probs": probs, "num_classes": 2}},
			"usage": map[string]int{"prompt_tokens": 5, "total_tokens": 5, "completion_tokens": 0}})
	}))
	t.Cleanup(func() { close(d.block); d.srv.Close() })
	return d
}

func TestRemoteClassifiesAndCaches(t *testing.T) {
	d := newClassifyDouble(t)
	r, err := NewRemote(RemoteOptions{URL: d.srv.URL + "/classify", Model: "clf", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	p, err := r.Classify(context.Background(), "the integral of x")
	if err != nil || p.Label != "math" || p.Confidence != 0.9 || len(p.Probs) != 2 {
		t.Fatalf("%+v %v", p, err)
	}
	for i := 0; i < 3; i++ {
		if q, err := r.Classify(context.Background(), "the integral of x"); err != nil || q.Label != "math" {
			t.Fatalf("cached: %+v %v", q, err)
		}
	}
	if q, _ := r.Classify(context.Background(), "hello"); q.Label != "other" {
		t.Fatalf("%+v", q)
	}
	if n := d.calls.Load(); n != 2 {
		t.Fatalf("%d calls, want 2 (repeats answered by the cache)", n)
	}
	if s := r.Stats(); s.Calls != 2 || s.CacheHits != 3 || s.Errors != 0 {
		t.Fatalf("%+v", s)
	}
}

func TestRemoteCacheEvictsOldest(t *testing.T) {
	d := newClassifyDouble(t)
	r, _ := NewRemote(RemoteOptions{URL: d.srv.URL + "/classify", Model: "clf", Timeout: time.Minute, CacheEntries: 2})
	for _, s := range []string{"a", "b", "c", "a"} { // "a" was evicted by "c"
		r.Classify(context.Background(), s)
	}
	if n := d.calls.Load(); n != 4 {
		t.Fatalf("%d calls, want 4", n)
	}
}

func TestRemoteFailOpenAndClosed(t *testing.T) {
	d := newClassifyDouble(t)
	open, _ := NewRemote(RemoteOptions{URL: d.srv.URL + "/classify", Model: "clf", Timeout: time.Minute})
	closed, _ := NewRemote(RemoteOptions{URL: d.srv.URL + "/classify", Model: "clf", Timeout: time.Minute, FailClosed: true})
	wrong, _ := NewRemote(RemoteOptions{URL: d.srv.URL + "/classify", Model: "nope", Timeout: time.Minute, FailClosed: true})
	if _, err := wrong.Classify(context.Background(), "x"); !errors.Is(err, ErrRemote) || !strings.Contains(err.Error(), "400") {
		t.Errorf("unknown model: %v", err)
	}
	for _, mode := range []string{"500", "garbage", "huge"} {
		d.mode.Store(mode)
		text := "text for " + mode
		if p, err := open.Classify(context.Background(), text); err != nil || p.Label != "" {
			t.Errorf("%s, fail open: %+v %v", mode, p, err)
		}
		if _, err := closed.Classify(context.Background(), text); !errors.Is(err, ErrRemote) {
			t.Errorf("%s, fail closed: %v", mode, err)
		}
	}
	d.mode.Store("")
	if p, err := open.Classify(context.Background(), "text for 500"); err != nil || p.Label != "other" {
		t.Errorf("a failure is not cached: %+v %v", p, err)
	}
	if _, err := NewRemote(RemoteOptions{Model: "clf"}); err == nil {
		t.Error("no URL accepted")
	}
}

// With MaxConcurrent 1 and the only call held by the server, a second call cannot start
// and fails at its timeout; the held call, released, succeeds.
func TestRemoteConcurrencyBoundAndTimeout(t *testing.T) {
	d := newClassifyDouble(t)
	d.mode.Store("block")
	held, _ := NewRemote(RemoteOptions{URL: d.srv.URL + "/classify", Model: "clf", Timeout: time.Minute, MaxConcurrent: 1, FailClosed: true})
	done := make(chan error, 1)
	go func() { _, err := held.Classify(context.Background(), "first"); done <- err }()
	for d.calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := held.Classify(ctx, "second"); !errors.Is(err, ErrRemote) || !strings.Contains(err.Error(), "call slots") {
		t.Fatalf("second call: %v", err)
	}
	if n := d.calls.Load(); n != 1 {
		t.Fatalf("%d calls reached the server, want 1", n)
	}
	d.mode.Store("")
	d.block <- struct{}{}
	if err := <-done; err != nil {
		t.Fatalf("held call: %v", err)
	}
	short, _ := NewRemote(RemoteOptions{URL: d.srv.URL + "/classify", Model: "clf", Timeout: 10 * time.Millisecond, FailClosed: true})
	d.mode.Store("block")
	if _, err := short.Classify(context.Background(), "slow"); !errors.Is(err, ErrRemote) || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("timeout: %v", err)
	}
}

// BenchmarkRemoteCacheHit is a repeated text: no call.
func BenchmarkRemoteCacheHit(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"data":[{"index":0,"label":"math","probs":[1]}]}`))
	}))
	defer srv.Close()
	r, _ := NewRemote(RemoteOptions{URL: srv.URL, Model: "clf", Timeout: time.Minute})
	text := prose(2 << 10)
	r.Classify(context.Background(), text)
	b.ReportAllocs()
	for b.Loop() {
		r.Classify(context.Background(), text)
	}
}

// BenchmarkRemoteCall is one call to a loopback double: what kvroute adds over the
// remote model's own time (marshal, HTTP on loopback, parse).
func BenchmarkRemoteCall(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"data":[{"index":0,"label":"math","probs":[1]}]}`))
	}))
	defer srv.Close()
	r, _ := NewRemote(RemoteOptions{URL: srv.URL, Model: "clf", Timeout: time.Minute, CacheEntries: -1})
	text := prose(2 << 10)
	b.ReportAllocs()
	for b.Loop() {
		r.Classify(context.Background(), text)
	}
}
