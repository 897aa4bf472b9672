package tokenize

import (
	"errors"
	"testing"

	"github.com/kvroute/kvroute/internal/jsonvalue"
	"github.com/kvroute/kvroute/request"
)

// TestAnthropicMessages: a /v1/messages request renders like the chat request vLLM's
// Anthropic endpoint converts it to: top-level system → system message, text blocks →
// text, tool_use → tool_calls, tool_result → tool message.
func TestAnthropicMessages(t *testing.T) {
	m := loadFamily(t, "qwen3")
	anth, err := request.Parse(request.APIMessages, []byte(`{"model":"m","max_tokens":10,
		"system":[{"type":"text","text":"Be brief."}],
		"tools":[{"name":"get_weather","description":"Weather.","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],
		"messages":[
		 {"role":"user","content":"Weather in Oslo?"},
		 {"role":"assistant","content":[{"type":"text","text":"Checking."},{"type":"tool_use","id":"t1","name":"get_weather","input":{"city":"Oslo"}}]},
		 {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"-3 C"}]}]},
		 {"role":"user","content":[{"type":"text","text":"Thanks"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	chat, err := request.Parse(request.APIChat, []byte(`{"model":"m",
		"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather.","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
		"messages":[
		 {"role":"system","content":"Be brief."},
		 {"role":"user","content":"Weather in Oslo?"},
		 {"role":"assistant","content":"Checking.","tool_calls":[{"id":"t1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Oslo\"}"}}]},
		 {"role":"tool","tool_call_id":"t1","content":"-3 C"},
		 {"role":"user","content":"Thanks"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	a, err := m.RenderChat(anth)
	if err != nil {
		t.Fatal(err)
	}
	c, err := m.RenderChat(chat)
	if err != nil {
		t.Fatal(err)
	}
	if a != c {
		t.Errorf("messages request renders differently from its chat form:\n%q\n%q", a, c)
	}
	bad, _ := request.Parse(request.APIMessages, []byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`))
	if _, err := m.RenderChat(bad); !errors.Is(err, ErrContent) {
		t.Errorf("image block: %v, want ErrContent (the remote path handles it)", err)
	}
}

// TestChatVariables: reasoning_effort sets enable_thinking unless chat_template_kwargs
// gives it; continue_final_message with add_generation_prompt is refused as vLLM does.
func TestChatVariables(t *testing.T) {
	m := loadFamily(t, "qwen3")
	parse := func(body string) *request.Request {
		r, err := request.Parse(request.APIChat, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	off, _ := m.RenderChat(parse(`{"model":"m","messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"enable_thinking":false}}`))
	none, _ := m.RenderChat(parse(`{"model":"m","messages":[{"role":"user","content":"x"}],"reasoning_effort":"none"}`))
	high, _ := m.RenderChat(parse(`{"model":"m","messages":[{"role":"user","content":"x"}],"reasoning_effort":"high"}`))
	if off != none || off == high {
		t.Errorf("reasoning_effort none must render like enable_thinking=false and differ from high:\n%q\n%q\n%q", off, none, high)
	}
	if _, err := m.RenderChat(parse(`{"model":"m","messages":[{"role":"user","content":"x"}],"continue_final_message":true}`)); !errors.Is(err, ErrTemplate) {
		t.Errorf("continue_final_message with the default add_generation_prompt: %v, want ErrTemplate", err)
	}
}

// TestAnthropicConversion pins the conversion rules of vLLM's Anthropic endpoint.
func TestAnthropicConversion(t *testing.T) {
	r, err := request.Parse(request.APIMessages, []byte(`{"model":"m","max_tokens":1,
		"system":[{"type":"text","text":"x-anthropic-billing-header: abc"},{"type":"text","text":"A. "}],
		"messages":[
		 {"role":"system","content":"B."},
		 {"role":"user","content":"q"},
		 {"role":"assistant","content":[{"type":"thinking","thinking":"hmm"},{"type":"text","text":""},{"type":"tool_use","id":"t","name":"f","input":{"b":1,"a":"é"}}]},
		 {"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"r1"},{"type":"text","text":"r2"}]}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	got, err := anthropicToChat(r.System, r.Messages)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("got %d messages, want system, user, assistant, tool: %v", len(got), got)
	}
	str := func(v jsonvalue.Value, k string) string { s, _ := v.Field(k).Str(); return s }
	if str(got[0], "content") != "A. B." {
		t.Errorf("system = %q, want the billing header dropped and system parts joined", str(got[0], "content"))
	}
	if a := got[2]; str(a, "reasoning") != "hmm" || !a.Field("content").IsNull() || a.Field("tool_calls").Len() != 1 {
		t.Errorf("assistant = %s, want reasoning, tool_calls and no content", a.AppendJSON(nil))
	}
	if tm := got[3]; str(tm, "role") != "tool" || str(tm, "tool_call_id") != "t" || str(tm, "content") != "r1\nr2" {
		t.Errorf("tool message = %s", tm.AppendJSON(nil))
	}
}
