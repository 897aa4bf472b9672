package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/workers"
)

// vllmStream is what vLLM's chat endpoint streams for body (the chunk shapes of
// vllm/entrypoints/openai/serving_chat.py, deterministic ids and timestamps so that
// two runs compare byte for byte): content chunks, then the usage-only chunk when the
// body asks for stream_options.include_usage, then [DONE].
func vllmStream(body []byte) string {
	var req struct {
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	_ = json.Unmarshal(body, &req)
	head := `data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[`
	out := head + `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n" +
		head + `{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}` + "\n\n" +
		head + `{"index":0,"delta":{"content":"!"},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}` + "\n\n"
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		out += head + `],"usage":{"prompt_tokens":40,"total_tokens":42,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":32}}}` + "\n\n"
	}
	return out + "data: [DONE]\n\n"
}

// Issue 29: kvroute proxy asks a streamed chat request that names no stream_options
// for usage (on by default), so the ticket settles on the engine's usage with its
// cached tokens, and removes the usage chunk again: the client receives exactly the
// bytes the engine sends for its own request. A client that asked for usage, or
// said no, is forwarded as sent; with proxy.inject_include_usage off nothing changes.
// The engine is a stand-in for vLLM's stream format served over loopback HTTP,
// written in each chunk as vLLM flushes it.
func TestIncludeUsageInjectedAndStripped(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	engine := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range strings.SplitAfter(vllmStream(b), "\n\n") {
			io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	})
	up := httptest.NewServer(engine)
	t.Cleanup(up.Close)
	const plain = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for _, c := range []struct {
		name, body string
		inject     bool
		forwarded  string // what the engine must receive
		usage      string // kvroute_router_usage_reports_total kind counted
	}{
		{"no stream_options", plain, true, strings.TrimSuffix(plain, "}") + `,"stream_options":{"include_usage":true}}`, "reported"},
		{"asked for usage", strings.TrimSuffix(plain, "}") + `,"stream_options":{"include_usage":true}}`, true, "", "reported"},
		{"said no", strings.TrimSuffix(plain, "}") + `,"stream_options":{"include_usage":false}}`, true, "", "no_usage"},
		{"injection off", plain, false, "", "no_usage"},
	} {
		reg := workers.NewRegistry()
		reg.Set([]*workers.Worker{{Name: "w", Address: strings.TrimPrefix(up.URL, "http://"), Models: []string{"m"}}})
		ms := metrics.NewUnregistered()
		r := router.New(router.Options{Registry: reg, Models: []router.Model{{Name: "m"}}, Metrics: ms})
		px := config.Default().Proxy
		px.InjectIncludeUsage = c.inject
		srv := httptest.NewServer(New(Options{Router: r, Config: config.Default().ExtProc, Proxy: px, Metrics: ms}))
		resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		if err != nil {
			t.Fatal(err)
		}
		forwarded := c.forwarded
		if forwarded == "" {
			forwarded = c.body
		}
		mu.Lock()
		last := seen[len(seen)-1]
		mu.Unlock()
		if last != forwarded {
			t.Fatalf("%s: engine received\n%s\nwant\n%s", c.name, last, forwarded)
		}
		if want := vllmStream([]byte(c.body)); string(got) != want {
			t.Fatalf("%s: client received\n%q\nwant what the engine sends for the client's own request\n%q", c.name, got, want)
		}
		if n := testutil.ToFloat64(ms.Router.UsageReports.WithLabelValues(c.usage)); n != 1 {
			t.Fatalf("%s: usage_reports{kind=%s} = %v, want 1", c.name, c.usage, n)
		}
		if r.InFlight() != 0 {
			t.Fatalf("%s: ticket leaked", c.name)
		}
	}
}
