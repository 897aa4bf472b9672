package sim

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// namedEvents returns the (event, data) pairs of an SSE body with event lines.
func namedEvents(t *testing.T, r io.Reader) (names []string, data []map[string]any) {
	t.Helper()
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	var name string
	for sc.Scan() {
		line := sc.Text()
		if n, ok := strings.CutPrefix(line, "event: "); ok {
			name = n
			continue
		}
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			var m map[string]any
			if err := json.Unmarshal([]byte(d), &m); err != nil {
				t.Fatalf("event %s: %v: %s", name, err, d)
			}
			if m["type"] != name {
				t.Errorf("event line %q, data type %v", name, m["type"])
			}
			names, data = append(names, name), append(data, m)
			name = ""
		}
	}
	return names, data
}

// The conversation of these tests: a top-level system, one user text block.
// ChatML stand-in: system (5+3) + user (5+1) + generation prompt 3.
const (
	anthBody   = `{"model":"m","system":"t5 t6 t7","messages":[{"role":"user","content":[{"type":"text","text":"hello"}]}],"max_tokens":3`
	anthPrompt = (5 + 3) + (5 + 1) + 3
)

func TestMessagesStreamIsVLLMsEventSequence(t *testing.T) {
	for _, ping := range []bool{false, true} {
		p := testProfile()
		p.StepOverhead, p.PrefillPerToken, p.DecodePerSeq = 1000000, 1000, 1000
		_, url := startWorkerWith(t, WorkerOptions{Profile: p, Model: "m", Seed: 7, AnthropicPing: ping})
		resp := post(t, url+"/v1/messages", anthBody+`,"stream":true}`)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("status %d type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		names, data := namedEvents(t, resp.Body)
		resp.Body.Close()
		want := []string{"message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta",
			"content_block_stop", "message_delta", "message_stop"}
		if ping {
			want = append(want[:2], append([]string{"ping"}, want[2:]...)...)
		}
		if strings.Join(names, ",") != strings.Join(want, ",") {
			t.Fatalf("ping=%v: events %v, want %v", ping, names, want)
		}
		msg := data[0]["message"].(map[string]any)
		if !strings.HasPrefix(msg["id"].(string), "chatcmpl-") || msg["model"] != "m" || msg["role"] != "assistant" {
			t.Errorf("message_start %v", msg)
		}
		if u := msg["usage"].(map[string]any); u["input_tokens"] != float64(anthPrompt) || u["output_tokens"] != 0.0 {
			t.Errorf("message_start usage %v, want %d input tokens", u, anthPrompt)
		}
		if cb := data[1]["content_block"].(map[string]any); cb["type"] != "text" || cb["text"] != "" || data[1]["index"] != 0.0 {
			t.Errorf("content_block_start %v", data[1])
		}
		var text string
		for i, n := range names {
			if n == "content_block_delta" {
				d := data[i]["delta"].(map[string]any)
				if d["type"] != "text_delta" || data[i]["index"] != 0.0 {
					t.Errorf("delta %v", data[i])
				}
				text += d["text"].(string)
			}
		}
		if len(strings.Fields(text)) != 3 {
			t.Errorf("streamed text %q, want 3 stand-in tokens", text)
		}
		md := data[len(data)-2]
		if md["delta"].(map[string]any)["stop_reason"] != "max_tokens" {
			t.Errorf("message_delta %v", md)
		}
		u := md["usage"].(map[string]any)
		if u["input_tokens"] != float64(anthPrompt) || u["output_tokens"] != 3.0 || len(u) != 2 {
			t.Errorf("message_delta usage %v: want input %d, output 3, nothing else (vLLM reports no cache fields)", u, anthPrompt)
		}
	}
}

// The same engine serves /v1/messages and /v1/chat/completions: the Anthropic request's
// prompt is the chat request's, and a chat request after it finds its blocks cached.
func TestMessagesWholeRunsOnTheSameEngine(t *testing.T) {
	_, url := startWorker(t, true, nil)
	long := strings.Repeat("w ", 40)
	resp := post(t, url+"/v1/messages", `{"model":"m","system":"`+long+`","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`)
	var m struct {
		ID         string `json:"id"`
		Type       string `json:"type"`
		Role       string `json:"role"`
		Model      string `json:"model"`
		StopReason string `json:"stop_reason"`
		Content    []struct{ Type, Text string }
		Usage      map[string]int `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d: %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	wantPrompt := (5 + 40) + (5 + 1) + 3
	if m.Type != "message" || m.Role != "assistant" || m.Model != "m" || m.StopReason != "max_tokens" ||
		len(m.Content) != 1 || m.Content[0].Type != "text" || len(strings.Fields(m.Content[0].Text)) != 2 {
		t.Errorf("message %+v", m)
	}
	if m.Usage["input_tokens"] != wantPrompt || m.Usage["output_tokens"] != 2 || len(m.Usage) != 2 {
		t.Errorf("usage %v, want input %d output 2", m.Usage, wantPrompt)
	}
	resp = post(t, url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"system","content":"`+long+`"},{"role":"user","content":"hi"}],"max_tokens":2}`)
	var c struct {
		Usage struct {
			PromptTokens int            `json:"prompt_tokens"`
			Details      map[string]int `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&c)
	resp.Body.Close()
	if c.Usage.PromptTokens != wantPrompt || c.Usage.Details["cached_tokens"] != 48 {
		t.Errorf("chat after messages: %+v, want %d prompt tokens, 48 cached (3 blocks of 16)", c.Usage, wantPrompt)
	}
}

func TestMessagesErrorsAreAnthropicShaped(t *testing.T) {
	_, url := startWorker(t, false, nil)
	for _, c := range []struct {
		body   string
		status int
		typ    string
		msg    string
	}{
		{`not json`, 400, "BadRequestError", "invalid JSON"},
		{`{"messages":[{"role":"user","content":"a"}],"max_tokens":1}`, 400, "BadRequestError", "Model is required"},
		{`{"model":"m","messages":[{"role":"user","content":"a"}]}`, 400, "BadRequestError", "max_tokens"},
		{`{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":0}`, 400, "BadRequestError", "max_tokens must be positive"},
		{`{"model":"other","messages":[{"role":"user","content":"a"}],"max_tokens":1}`, 404, "NotFoundError", "`other` does not exist"},
		{`{"model":"m","messages":[],"max_tokens":1}`, 400, "BadRequestError", "at least one item"},
		{`{"model":"m","messages":[{"role":"user","content":[]}],"max_tokens":1}`, 400, "BadRequestError", "must not be empty"},
		{`{"model":"m","messages":[{"role":"tool","content":"a"}],"max_tokens":1}`, 400, "BadRequestError", "messages[0].role"},
		{`{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{}}]}],"max_tokens":1}`, 400, "BadRequestError", `"image"`},
		{`{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":100000}`, 400, "BadRequestError", "maximum context length"},
	} {
		resp := post(t, url+"/v1/messages", c.body)
		var e struct {
			Type  string `json:"type"`
			Error struct{ Type, Message string }
		}
		err := json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if err != nil || resp.StatusCode != c.status || e.Type != "error" || e.Error.Type != c.typ || !strings.Contains(e.Error.Message, c.msg) {
			t.Errorf("%s: status %d %+v (%v), want %d %s containing %q", c.body, resp.StatusCode, e, err, c.status, c.typ, c.msg)
		}
	}
}

// A client that goes away mid-stream frees its engine slot (as on the OpenAI routes).
func TestMessagesStreamClientGoneCancels(t *testing.T) {
	w, url := startWorker(t, false, nil)
	req, _ := http.NewRequest("POST", url+"/v1/messages", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":500,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if line, _ := br.ReadString('\n'); line != "event: message_start\n" {
		t.Fatalf("first line %q", line)
	}
	resp.Body.Close()
	deadline := time.Now().Add(10 * time.Second) // a bound on a hang, not a speed check
	for w.Runner.Stats().Running+w.Runner.Stats().Waiting > 0 {
		if time.Now().After(deadline) {
			t.Fatal("request still in the engine after the client went away")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if s := w.Runner.Stats(); s.FreeBlocks != 64 {
		t.Errorf("free blocks %d after abort, want 64", s.FreeBlocks)
	}
}
