package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
)

// vllmChatEngine answers /v1/chat/completions streams in vLLM's exact chunk format
// (vllm/entrypoints/openai/serving_chat.py), deterministic so that two answers compare
// byte for byte: content chunks, the usage-only chunk only when the body asks for
// stream_options.include_usage, [DONE]; each event flushed as vLLM does. It records
// the bodies and content-length headers it receives; /metrics is an idle engine.
type vllmChatEngine struct {
	mu     sync.Mutex
	bodies []string
	cls    []string
}

func vllmChatStream(body []byte) string {
	var req struct {
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	_ = json.Unmarshal(body, &req)
	ev := func(rest string) string {
		return `data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1700000001,"model":"m","choices":[` + rest + "\n\n"
	}
	out := ev(`{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`)
	for i, tok := range []string{"Hel", "lo", " there"} {
		fin := "null"
		if i == 2 {
			fin = `"length"`
		}
		out += ev(fmt.Sprintf(`{"index":0,"delta":{"content":%q},"logprobs":null,"finish_reason":%s}]}`, tok, fin))
	}
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		out += ev(`],"usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":0}}}`)
	}
	return out + "data: [DONE]\n\n"
}

func (e *vllmChatEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/metrics" {
		fmt.Fprint(w, "vllm:num_requests_waiting{model_name=\"m\"} 0\nvllm:num_requests_running{model_name=\"m\"} 0\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0\n")
		return
	}
	b, _ := io.ReadAll(r.Body)
	e.mu.Lock()
	e.bodies, e.cls = append(e.bodies, string(b)), append(e.cls, r.Header.Get("Content-Length"))
	e.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	for _, ev := range strings.SplitAfter(vllmChatStream(b), "\n\n") {
		io.WriteString(w, ev)
		w.(http.Flusher).Flush()
	}
}

func (e *vllmChatEngine) last() (body, contentLength string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.bodies[len(e.bodies)-1], e.cls[len(e.cls)-1]
}

// extproc.inject_include_usage through the Envoy stand-in: in the body mode pairs where
// Envoy lets the processor replace the request body (BUFFERED, FULL_DUPLEX_STREAMED) and
// the response body (STREAMED chunk by chunk, BUFFERED whole, FULL_DUPLEX_STREAMED), a
// streamed request without stream_options reaches the engine with include_usage (and
// a content-length that matches: Envoy 500s a mismatch), the ticket settles on the
// engine's usage, and the client receives byte for byte what the engine sends for the
// client's own request; in the other pairs nothing is injected. A client that set
// stream_options, or the option off, is forwarded as sent.
func TestExtProcIncludeUsage(t *testing.T) {
	const plain = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	withOpts := func(v string) string { return strings.TrimSuffix(plain, "}") + `,"stream_options":` + v + `}` }
	for _, m := range []struct {
		req, rsp Mode
		chunk    int // the stand-in's read size on the response (0: default)
		injects  bool
	}{
		{Buffered, Streamed, 0, true},
		{Buffered, Streamed, 7, true}, // events split across body messages
		{Buffered, Buffered, 0, true},
		{FullDuplex, FullDuplex, 5, true},
		{Buffered, None, 0, false},
		{Streamed, Streamed, 0, false},
		{Buffered, BufferedPartial, 0, false},
	} {
		t.Run(fmt.Sprintf("%s-%s-%d", m.req, m.rsp, m.chunk), func(t *testing.T) {
			for _, c := range []struct {
				name, body string
				off        bool // extproc.inject_include_usage false
				injected   bool
			}{
				{"no stream_options", plain, false, m.injects},
				{"asked for usage", withOpts(`{"include_usage":true}`), false, false},
				{"said no", withOpts(`{"include_usage":false}`), false, false},
				{"null", withOpts(`null`), false, false},
				{"option off", plain, true, false},
			} {
				eng := &vllmChatEngine{}
				envoy := Config{RequestBodyMode: m.req, ResponseBodyMode: m.rsp, ChunkSize: m.chunk}
				fleet := func(cfg *config.Config) {
					srv := httptest.NewServer(eng)
					t.Cleanup(srv.Close)
					cfg.Workers = append(cfg.Workers, config.Worker{Name: "e1", Address: strings.TrimPrefix(srv.URL, "http://")})
				}
				f := newFixture(t, fixtureOpts{workers: 1, fleet: fleet, envoy: envoy,
					cfg: func(cfg *config.Config) { cfg.ExtProc.InjectIncludeUsage = !c.off }})
				st, _, got := f.do("POST", "/v1/chat/completions", c.body)
				if st != 200 {
					t.Fatalf("%s: %d %s", c.name, st, got)
				}
				sent, cl := eng.last()
				want := c.body
				if c.injected {
					want = withOpts(`{"include_usage":true}`)
				}
				if sent != want {
					t.Fatalf("%s: engine received\n%s\nwant\n%s", c.name, sent, want)
				}
				if cl != "" && cl != fmt.Sprint(len(sent)) {
					t.Fatalf("%s: content-length %s for a %d-byte body", c.name, cl, len(sent))
				}
				if exp := vllmChatStream([]byte(c.body)); got != exp {
					t.Fatalf("%s: client received\n%q\nwant what the engine sends for the client's own request\n%q", c.name, got, exp)
				}
				f.waitInFlight(0)
				kind := "no_usage"
				if c.injected || strings.Contains(c.body, `"include_usage":true`) {
					kind = "reported"
				}
				if m.rsp == None {
					kind = "" // no response body reaches kvroute: no usage report at all
				}
				if kind != "" {
					if n := testutil.ToFloat64(f.app.Metrics.Router.UsageReports.WithLabelValues(kind)); n != 1 {
						t.Fatalf("%s: usage_reports{kind=%s} = %v, want 1", c.name, kind, n)
					}
				}
			}
		})
	}
}
