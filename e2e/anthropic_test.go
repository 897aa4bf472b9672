package e2e

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/response"
)

// Real Anthropic Messages calls, through both fronts, to simulated vLLM engines serving
// /v1/messages as vLLM does: the client gets vLLM's event sequence and usage untouched,
// kvroute reads the usage (input and output tokens; vLLM reports no cached count, so the
// usage report is "absent", not "no_usage"), and every ticket is released with outcome ok.
func TestAnthropicMessagesThroughBothFronts(t *testing.T) {
	for _, front := range []struct {
		name string
		o    fixtureOpts
	}{
		{"ext_proc buffered/streamed (Envoy stand-in)", fixtureOpts{envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed}}},
		{"ext_proc full duplex (Envoy stand-in)", fixtureOpts{envoy: Config{RequestBodyMode: FullDuplex, ResponseBodyMode: FullDuplex}}},
		{"kvroute proxy", fixtureOpts{proxy: true}},
	} {
		t.Run(front.name, func(t *testing.T) {
			o := front.o
			o.simAdapters = []string{}
			o.cfg = func(c *config.Config) { c.Scoring.Scrape.Interval = 50 * time.Millisecond }
			f := newFixture(t, o)
			const conv = `{"model":"m","max_tokens":4,"system":"you are terse","messages":[{"role":"user","content":[{"type":"text","text":"t11 t12 t13"}]}]`
			// the prompt as the simulator's stand-in ChatML renders it
			const prompt = (5 + 3) + (5 + 3) + 3

			st, h, body := f.do("POST", "/v1/messages", conv+`}`)
			if st != 200 || !strings.HasPrefix(h.Get("Content-Type"), "application/json") {
				t.Fatalf("plain: %d %s", st, body)
			}
			var m struct {
				Type, Role, StopReason string
				Content                []struct{ Type, Text string }
				Usage                  map[string]int
			}
			if err := json.Unmarshal([]byte(body), &m); err != nil {
				t.Fatal(err)
			}
			if m.Type != "message" || len(m.Content) != 1 || m.Content[0].Type != "text" || len(strings.Fields(m.Content[0].Text)) != 4 ||
				m.Usage["input_tokens"] != prompt || m.Usage["output_tokens"] != 4 {
				t.Fatalf("plain message %s", body)
			}
			f.waitInFlight(0)
			f.waitOutcome(response.OutcomeOK, 1)

			req, _ := http.NewRequest("POST", f.url+"/v1/messages", strings.NewReader(conv+`,"stream":true}`))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			names, usages := anthropicStream(t, resp)
			want := "message_start,content_block_start,content_block_delta,content_block_delta,content_block_delta,content_block_delta," +
				"content_block_stop,message_delta,message_stop"
			if strings.Join(names, ",") != want {
				t.Fatalf("streamed events %v, want %s", names, want)
			}
			if usages[0]["input_tokens"] != prompt || usages[1]["input_tokens"] != prompt || usages[1]["output_tokens"] != 4 {
				t.Fatalf("stream usage %v", usages)
			}
			f.waitInFlight(0)
			f.waitOutcome(response.OutcomeOK, 2)
			if got := testutil.ToFloat64(f.app.Metrics.Router.UsageReports.WithLabelValues("absent")); got != 2 {
				t.Errorf("usage reports{absent} = %v, want 2: kvroute read both answers' usage", got)
			}
			if got := testutil.ToFloat64(f.app.Metrics.Router.UsageReports.WithLabelValues("no_usage")); got != 0 {
				t.Errorf("usage reports{no_usage} = %v, want 0", got)
			}
			served := 0
			for _, s := range f.sims {
				served += int(s.Runner.Stats().PrefixQueries)
			}
			if served != 2*prompt {
				t.Errorf("the engines looked up %d prompt tokens, want %d (two requests)", served, 2*prompt)
			}
		})
	}
}

// anthropicStream reads an Anthropic SSE body: the event names in order, and the usage
// of message_start (its message's) and of message_delta.
func anthropicStream(t *testing.T, resp *http.Response) (names []string, usages []map[string]int) {
	t.Helper()
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if n, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			names = append(names, n)
			continue
		}
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type    string
			Message *struct{ Usage map[string]int }
			Usage   map[string]int
		}
		if err := json.Unmarshal([]byte(d), &ev); err != nil {
			t.Fatalf("%v: %s", err, d)
		}
		switch {
		case ev.Type == "message_start" && ev.Message != nil:
			usages = append(usages, ev.Message.Usage)
		case ev.Type == "message_delta":
			usages = append(usages, ev.Usage)
		}
	}
	if len(usages) != 2 {
		t.Fatalf("usages %v", usages)
	}
	return names, usages
}
