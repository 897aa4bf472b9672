package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// testWorker is a tiny OpenAI/Anthropic-speaking HTTP worker (until the simulator
// lands): JSON or SSE answers with usage, and knobs for failures and pacing.
type testWorker struct {
	srv  *httptest.Server
	name string
	hits atomic.Int64

	mu       sync.Mutex
	lastHdr  http.Header
	lastBody []byte
	lastLen  int64 // content-length of the last request, -1 chunked

	status  atomic.Int64  // non-zero: answer this status with an error JSON
	gate    chan struct{} // non-nil: SSE waits for a value (or close) after the first token
	arrived chan string   // non-nil: told the worker name when a request arrives, before answering
	hold    chan struct{} // non-nil: wait for close before answering at all
	trailer bool          // send an HTTP trailer after the body
}

func newTestWorker(t *testing.T, name string) *testWorker {
	w := &testWorker{name: name}
	w.srv = httptest.NewServer(http.HandlerFunc(w.serve))
	t.Cleanup(w.srv.Close)
	return w
}

func (w *testWorker) addr() string { return strings.TrimPrefix(w.srv.URL, "http://") }

func (w *testWorker) last() (http.Header, []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastHdr, w.lastBody
}

func (w *testWorker) lastCL() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastLen
}

func (w *testWorker) serve(rw http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/metrics" {
		// kvroute's scraper polls vLLM's Prometheus gauges; an idle engine.
		rw.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(rw, "vllm:num_requests_waiting{model_name=\"m\"} 0\nvllm:num_requests_running{model_name=\"m\"} 0\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0\n")
		return
	}
	if !strings.HasPrefix(r.URL.Path, "/v1/") {
		// e.g. kvroute's remote tokenization (POST /tokenize): not offered here, so
		// kvroute falls back to a load-only pick; only client traffic is recorded.
		http.NotFound(rw, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	w.hits.Add(1)
	w.mu.Lock()
	w.lastHdr, w.lastBody, w.lastLen = r.Header.Clone(), body, r.ContentLength
	w.mu.Unlock()
	if w.arrived != nil {
		w.arrived <- w.name
	}
	if w.hold != nil {
		select {
		case <-w.hold:
		case <-r.Context().Done():
			return
		}
	}
	rw.Header().Set("X-Served-By", w.name)
	if sc, ok := scripts[r.Header.Get("X-Test-Script")]; ok {
		sc.serve(rw, r)
		return
	}
	if st := int(w.status.Load()); st != 0 {
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(st)
		fmt.Fprintf(rw, `{"error":{"message":"worker failure","type":"internal_error","code":%d}}`, st)
		return
	}
	if r.URL.Path == "/v1/models" {
		rw.Header().Set("Content-Type", "application/json")
		fmt.Fprint(rw, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		return
	}
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(body, &req)
	if w.trailer {
		rw.Header().Set("Trailer", "X-Finish")
	}
	anthropic := r.URL.Path == "/v1/messages"
	if !req.Stream {
		rw.Header().Set("Content-Type", "application/json")
		if anthropic {
			fmt.Fprint(rw, `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hello world"}],"stop_reason":"end_turn","usage":{"input_tokens":9,"output_tokens":2}}`)
		} else {
			fmt.Fprint(rw, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello world"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":0}}}`)
		}
		if w.trailer {
			rw.Header().Set("X-Finish", "stop")
		}
		return
	}
	rw.Header().Set("Content-Type", "text/event-stream")
	rw.Header().Set("Cache-Control", "no-cache")
	fl := http.NewResponseController(rw)
	var events []string
	if anthropic {
		events = []string{
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":9,\"output_tokens\":0}}}\n\n",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" world\"}}\n\n",
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\n",
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
		}
	} else {
		events = []string{
			"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
			"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"text\":\"Hello\"}]}\n\n",
			"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"},\"text\":\" world\",\"finish_reason\":\"stop\"}]}\n\n",
			"data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n",
			"data: [DONE]\n\n",
		}
	}
	for i, ev := range events {
		if _, err := io.WriteString(rw, ev); err != nil {
			return
		}
		_ = fl.Flush()
		if i == 1 && w.gate != nil {
			select {
			case <-w.gate:
			case <-r.Context().Done():
				return
			}
		}
	}
	if w.trailer {
		rw.Header().Set("X-Finish", "stop")
	}
}

// script is a scripted worker answer, chosen by the request header X-Test-Script (a
// key of scripts): the status, content type and body events a vLLM worker sends in
// the case the name says.
type script struct {
	status int
	sse    bool
	events []string
	// hold: after the last event, keep the response open until the client's side
	// goes away (the connection is closed by the client, not by the worker).
	hold bool
	// holdAfter > 0: hold after this many events instead of finishing.
	holdAfter int
}

const (
	sseHello  = "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n"
	sseFinish = "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"},\"finish_reason\":\"stop\"}]}\n\n"
	sseUsage  = "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n"
	sseDone   = "data: [DONE]\n\n"
)

var scripts = map[string]script{
	"client_error":   {status: 400, events: []string{`{"error":{"message":"chat template refused","type":"BadRequestError","param":null,"code":400}}`}},
	"upstream_error": {status: 500, events: []string{`{"error":{"message":"engine dead","type":"InternalServerError","param":null,"code":500}}`}},
	"only_done":      {status: 200, sse: true, events: []string{sseDone}},
	"error_event": {status: 200, sse: true, events: []string{sseHello,
		"data: {\"error\":{\"message\":\"engine dead\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\n", sseDone}},
	"json_error":      {status: 200, events: []string{`{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}`}},
	"truncated":       {status: 200, sse: true, events: []string{sseHello}},
	"hang_up_on_done": {status: 200, sse: true, events: []string{sseHello, sseFinish, sseUsage, sseDone}, hold: true},
	"hang_mid_stream": {status: 200, sse: true, events: []string{sseHello, sseFinish, sseUsage, sseDone}, holdAfter: 1},
}

func (sc script) serve(rw http.ResponseWriter, r *http.Request) {
	if sc.sse {
		rw.Header().Set("Content-Type", "text/event-stream")
	} else {
		rw.Header().Set("Content-Type", "application/json")
	}
	rw.WriteHeader(sc.status)
	fl := http.NewResponseController(rw)
	for i, ev := range sc.events {
		if sc.holdAfter > 0 && i == sc.holdAfter {
			break
		}
		if _, err := io.WriteString(rw, ev); err != nil {
			return
		}
		_ = fl.Flush()
	}
	if sc.hold || sc.holdAfter > 0 {
		<-r.Context().Done()
	}
}
