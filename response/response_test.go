package response

import (
	"strings"
	"testing"
)

const chatSSE = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
	": keep-alive\n\n" +
	"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n" +
	"data: {\"choices\":[{\"delta\":{\"content\":\" there\"}}]}\n\n" +
	"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n" +
	"data: [DONE]\n\n"

// Events split at every possible byte boundary (envoy#45437): the first token is
// reported exactly once, on the chunk that completes the first content event, and
// usage is parsed.
func TestSSEEverySplit(t *testing.T) {
	firstEnd := strings.Index(chatSSE, `"Hi"}}],"usage":null}`) + len(`"Hi"}}],"usage":null}`) + 1 // through its newline
	for split := 0; split <= len(chatSSE); split++ {
		tr := NewTracker(true, 0)
		a := tr.Write([]byte(chatSSE[:split]))
		b := tr.Write([]byte(chatSSE[split:]))
		if a == b {
			t.Fatalf("split %d: first token reported %v/%v, want exactly once", split, a, b)
		}
		if wantA := split >= firstEnd; a != wantA {
			t.Fatalf("split %d: first token on first chunk = %v, want %v", split, a, wantA)
		}
		u := tr.Finish()
		if u != (Usage{PromptTokens: 12, CompletionTokens: 2, CachedTokens: 8, CachedReported: true, Present: true}) {
			t.Fatalf("split %d: usage %+v", split, u)
		}
	}
}

func TestFirstTokenKinds(t *testing.T) {
	for name, ev := range map[string]string{
		"content":            `{"choices":[{"delta":{"content":"x"}}]}`,
		"reasoning":          `{"choices":[{"delta":{"reasoning_content":"hmm"}}]}`,
		"reasoning2":         `{"choices":[{"delta":{"reasoning":"hmm"}}]}`,
		"tool call":          `{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}}]}}]}`,
		"completions":        `{"choices":[{"text":"once"}]}`,
		"anthropic text":     `{"type":"content_block_delta","delta":{"type":"text_delta","text":"x"}}`,
		"anthropic tool":     `{"type":"content_block_delta","delta":{"type":"input_json_delta","partial_json":"{"}}`,
		"anthropic thinking": `{"type":"content_block_delta","delta":{"type":"thinking_delta","thinking":"x"}}`,
	} {
		tr := NewTracker(true, 0)
		if !tr.Write([]byte("data: "+ev+"\r\n\r\n")) || !tr.FirstTokenSeen() {
			t.Errorf("%s: not a first token", name)
		}
	}
	for name, ev := range map[string]string{
		"role only":       `{"choices":[{"delta":{"role":"assistant"}}]}`,
		"empty content":   `{"choices":[{"delta":{"content":""}}]}`,
		"empty text":      `{"choices":[{"text":""}]}`,
		"usage only":      `{"choices":[],"usage":{"prompt_tokens":1}}`,
		"anthropic start": `{"type":"message_start","message":{"usage":{"input_tokens":3}}}`,
		"not json":        `{oops`,
	} {
		tr := NewTracker(true, 0)
		if tr.Write([]byte("data: " + ev + "\n\n")) {
			t.Errorf("%s: must not be a first token", name)
		}
	}
	tr := NewTracker(true, 0)
	if tr.Write([]byte("event: ping\ndata: [DONE]\nid: 1\n\n")) {
		t.Error("[DONE] is not a token")
	}
}

// Anthropic: input tokens from message_start, output tokens from message_delta.
func TestAnthropicUsageMerge(t *testing.T) {
	tr := NewTracker(true, 0)
	tr.Write([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"cache_read_input_tokens\":4,\"output_tokens\":1}}}\n\n"))
	tr.Write([]byte("event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n\n"))
	if u := tr.Finish(); u != (Usage{PromptTokens: 9, CompletionTokens: 7, CachedTokens: 4, CachedReported: true, Present: true}) {
		t.Fatalf("%+v", u)
	}
}

// An unterminated last line is parsed at Finish.
func TestFinishParsesUnterminatedLine(t *testing.T) {
	tr := NewTracker(true, 0)
	tr.Write([]byte(`data: {"choices":[{"delta":{"content":"x"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`))
	if tr.FirstTokenSeen() {
		t.Fatal("no newline yet")
	}
	u := tr.Finish()
	if !tr.FirstTokenSeen() || u.PromptTokens != 3 {
		t.Fatalf("%+v", u)
	}
}

// A runaway line without newline is dropped instead of growing without bound.
func TestRunawayLineBounded(t *testing.T) {
	tr := NewTracker(true, 1024)
	for i := 0; i < 10; i++ {
		tr.Write([]byte(strings.Repeat("x", 600)))
	}
	if len(tr.pending) > 1024 {
		t.Fatalf("pending %d bytes", len(tr.pending))
	}
	if tr.Write([]byte("\ndata: {\"choices\":[{\"text\":\"y\"}]}\n")) != true {
		t.Fatal("tracking resumes after a dropped line")
	}
}

// A non-streamed JSON body: no first token; usage at Finish; over the bound → no usage.
func TestJSONBody(t *testing.T) {
	body := `{"choices":[{"message":{"content":"hello"}}],"usage":{"prompt_tokens":20,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":16}}}`
	tr := NewTracker(false, 0)
	if tr.Write([]byte(body[:30])) || tr.Write([]byte(body[30:])) {
		t.Fatal("JSON bodies report no first token")
	}
	if u := tr.Finish(); u != (Usage{PromptTokens: 20, CompletionTokens: 3, CachedTokens: 16, CachedReported: true, Present: true}) {
		t.Fatalf("%+v", u)
	}
	tr = NewTracker(false, 64)
	tr.Write([]byte(body))
	if u := tr.Finish(); u.Present {
		t.Fatalf("overflowed body must report no usage, got %+v", u)
	}
	tr = NewTracker(false, 0)
	tr.Write([]byte(`{"error":"x"}`))
	if u := tr.Finish(); u.Present {
		t.Fatalf("no usage object: %+v", u)
	}
	tr = NewTracker(false, 0)
	tr.Write([]byte(`not json`))
	if u := tr.Finish(); u.Present {
		t.Fatal("invalid JSON: no usage")
	}
}

// BenchmarkTrackerStream feeds a 256-event chat stream (vLLM's chunk shape, one event
// per chunk) through a tracker: the per-response cost of SSE tracking on both fronts.
func BenchmarkTrackerStream(b *testing.B) {
	ev := []byte("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n")
	last := []byte("data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":256}}\n\ndata: [DONE]\n\n")
	b.SetBytes(int64(256*len(ev) + len(last)))
	b.ReportAllocs()
	for b.Loop() {
		tr := NewTracker(true, 0)
		for i := 0; i < 256; i++ {
			tr.Write(ev)
		}
		tr.Write(last)
		tr.Finish()
	}
}
