package request

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/jsonvalue"
)

func TestAPIForPath(t *testing.T) {
	for path, want := range map[string]API{
		"/v1/chat/completions":        APIChat,
		"/v1/chat/completions/":       APIOther, // exact, as vLLM's routes (FastAPI redirects it)
		"/v1/chat/completions?x=1":    APIChat,
		"/v1/completions":             APICompletions,
		"/v1/messages":                APIMessages,
		"/v1/messages?beta=true":      APIMessages,
		"/v1/models":                  APIOther,
		"/v1/embeddings":              APIOther,
		"/":                           APIOther,
		"":                            APIOther,
		"/v1/chat/completions/extra":  APIOther,
		"/V1/CHAT/COMPLETIONS":        APIOther,
		"/prefix/v1/chat/completions": APIOther,
	} {
		if got := APIForPath(path); got != want {
			t.Errorf("APIForPath(%q) = %q, want %q", path, got, want)
		}
	}
}

func TestParseChat(t *testing.T) {
	r, err := Parse(APIChat, []byte(`{"model":"m","stream":true,"stream_options":{"include_usage":true},
		"max_tokens":5,"max_completion_tokens":9,"add_generation_prompt":false,"continue_final_message":true,
		"chat_template_kwargs":{"enable_thinking":false},"reasoning_effort":"low","cache_salt":"s1",
		"tools":[{"type":"function","function":{"name":"f"}}],
		"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":null,"tool_calls":[]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.API != APIChat || r.Model != "m" || !r.Stream || !r.IncludeUsage || r.MaxTokens != 9 || len(r.Messages) != 2 ||
		len(r.Tools) != 1 || r.AddGenerationPrompt == nil || *r.AddGenerationPrompt || !r.ContinueFinalMessage ||
		!kwargFalse(r, "enable_thinking") || r.ReasoningEffort != "low" || r.CacheSalt != "s1" {
		t.Fatalf("parsed %+v", r)
	}
	if r.Messages[0].Field("content").Kind() != jsonvalue.Array {
		t.Fatal("multi-part content must be kept as sent")
	}
	r, _ = Parse(APIChat, []byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`))
	if r.MaxTokens != 5 || r.Stream || r.AddGenerationPrompt != nil {
		t.Fatalf("max_tokens alone: %+v", r)
	}
}

func kwargFalse(r *Request, key string) bool {
	v, ok := r.Kwarg(key)
	return ok && v.Kind() == jsonvalue.Bool && !v.Boolean()
}

func TestParseCompletionsPromptShapes(t *testing.T) {
	for body, check := range map[string]func(*Request) bool{
		`{"model":"m","prompt":"once"}`:             func(r *Request) bool { return len(r.Prompts) == 1 && r.Prompts[0] == "once" },
		`{"model":"m","prompt":["a","b"]}`:          func(r *Request) bool { return len(r.Prompts) == 2 },
		`{"model":"m","prompt":[1,2,3]}`:            func(r *Request) bool { return len(r.PromptTokenIDs) == 1 && len(r.PromptTokenIDs[0]) == 3 },
		`{"model":"m","prompt":[[1,2],[3]]}`:        func(r *Request) bool { return len(r.PromptTokenIDs) == 2 && r.PromptTokenIDs[1][0] == 3 },
		`{"model":"m","prompt":"","stream":true}`:   func(r *Request) bool { return len(r.Prompts) == 1 && r.Stream },
		`{"model":"m","prompt":"x","max_tokens":0}`: func(r *Request) bool { return r.MaxTokens == 0 },
	} {
		r, err := Parse(APICompletions, []byte(body))
		if err != nil || !check(r) {
			t.Errorf("%s: %+v %v", body, r, err)
		}
	}
}

func TestParseMessages(t *testing.T) {
	r, err := Parse(APIMessages, []byte(`{"model":"m","max_tokens":64,"system":[{"type":"text","text":"sys"}],"messages":[{"role":"user","content":"hi"}],"stream":true}`))
	if err != nil || r.System.Kind() != jsonvalue.Array || r.MaxTokens != 64 || !r.Stream {
		t.Fatalf("%+v %v", r, err)
	}
}

// Every failure path: the status is 400, the type invalid_request_error, and the
// param names the field when there is one.
func TestParseErrors(t *testing.T) {
	for _, c := range []struct {
		api   API
		body  string
		param string
	}{
		{APIChat, ``, ""},
		{APIChat, "  \n\t", ""},
		{APIChat, `{"model":`, ""},
		{APIChat, `[1,2]`, ""},
		{APIChat, `{"model":3,"messages":[]}`, "model"},
		{APIChat, `{"messages":[{"role":"user","content":"x"}]}`, "model"},
		{APIChat, `{"model":"m"}`, "messages"},
		{APIChat, `{"model":"m","messages":[]}`, "messages"},
		{APIChat, `{"model":"m","messages":[null]}`, "messages"},
		{APIChat, `{"model":"m","messages":[{"content":"x"}]}`, "messages"},
		{APIChat, `{"model":"m","messages":[{"role":1}]}`, "messages"},
		{APIChat, `{"model":"m","max_tokens":-1,"messages":[{"role":"user"}]}`, "max_tokens"},
		{APIChat, `{"model":"m","max_completion_tokens":-3,"messages":[{"role":"user"}]}`, "max_tokens"},
		{APIMessages, `{"model":"m","messages":[{"role":"user","content":"x"}]}`, "max_tokens"},
		{APIMessages, `{"model":"m","max_tokens":1,"messages":[]}`, "messages"},
		{APICompletions, `{"model":"m"}`, "prompt"},
		{APICompletions, `{"model":"m","prompt":null}`, "prompt"},
		{APICompletions, `{"model":"m","prompt":42}`, "prompt"},
		{APICompletions, `{"model":"m","prompt":[]}`, "prompt"},
		{APICompletions, `{"model":"m","prompt":["a",1]}`, "prompt"},
		{APICompletions, `{"model":"m","prompt":[[1],[]]}`, "prompt"},
		{APICompletions, `{"model":"m","prompt":[-1]}`, "prompt"},
		{API("bogus"), `{"model":"m"}`, ""},
	} {
		_, err := Parse(c.api, []byte(c.body))
		e, ok := AsError(err)
		if !ok {
			t.Errorf("%s %q: err %v is not *Error", c.api, c.body, err)
			continue
		}
		if e.Status != http.StatusBadRequest || e.Type != "invalid_request_error" || e.Param != c.param || e.Message == "" {
			t.Errorf("%s %q: %+v, want 400 invalid_request_error param %q", c.api, c.body, e, c.param)
		}
	}
}

// Non-inference paths never fail: the model is read when the body has one.
func TestParseOther(t *testing.T) {
	for body, model := range map[string]string{``: "", `{"model":"e5","input":"x"}`: "e5", `not json`: "", `{"model":1}`: ""} {
		r, err := Parse(APIOther, []byte(body))
		if err != nil || r.API != APIOther || r.Model != model {
			t.Errorf("%q: %+v %v", body, r, err)
		}
	}
}

func TestErrorJSONAndTooLarge(t *testing.T) {
	var v struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    int     `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(ErrorJSON(400, "invalid_request_error", "", `bad "x"`), &v); err != nil || v.Error.Param != nil || v.Error.Code != 400 || v.Error.Message != `bad "x"` {
		t.Fatalf("%+v %v", v, err)
	}
	if err := json.Unmarshal(ErrorJSON(400, "t", "model", "m"), &v); err != nil || v.Error.Param == nil || *v.Error.Param != "model" {
		t.Fatalf("param: %+v %v", v, err)
	}
	e := TooLarge(1024)
	if e.Status != 413 || !strings.Contains(e.Message, "1024") {
		t.Fatalf("%+v", e)
	}
	if _, ok := AsError(nil); ok {
		t.Fatal("nil is not an *Error")
	}
}

// SniffModel reads the model of a body cut at a buffer limit (BUFFERED_PARTIAL).
func TestSniffModel(t *testing.T) {
	full := `{"stream":true,"model":"qwen","messages":[{"role":"user","content":"long"}]}`
	for body, want := range map[string]string{
		full:                      "qwen",
		full[:40]:                 "qwen",
		full[:25]:                 "",
		`{"messages":[{"role":"u`: "",
		`{"model":7}`:             "",
		`[1,2]`:                   "",
		``:                        "",
		`{"a":{"model":"inner"}}`: "",
	} {
		if got, _ := SniffModel([]byte(body)); got != want {
			t.Errorf("SniffModel(%q) = %q, want %q", body, got, want)
		}
	}
}

// JSON type errors name the field and the expected JSON type, set Param, and never show
// Go type or struct names; syntax errors say the body is not valid JSON.
func TestParseTypeErrorMessages(t *testing.T) {
	for _, c := range []struct {
		api   API
		body  string
		param string
		msg   string
	}{
		{APIChat, `{"model":"m","messages":"x"}`, "messages", "field 'messages' must be an array of objects, got string"},
		{APIChat, `{"model":"m","messages":["x"]}`, "messages", "field 'messages' must be an array of objects, got an element of type string"},
		{APIChat, `{"model":5,"messages":[{"role":"user"}]}`, "model", "field 'model' must be a string, got number"},
		{APIChat, `{"model":"m","max_tokens":"x","messages":[{"role":"user"}]}`, "max_tokens", "field 'max_tokens' must be an integer, got string"},
		{APIChat, `{"model":"m","max_tokens":1.5,"messages":[{"role":"user"}]}`, "max_tokens", "field 'max_tokens' must be an integer, got number 1.5"},
		{APIChat, `{"model":"m","stream":"yes","messages":[{"role":"user"}]}`, "stream", "field 'stream' must be a boolean, got string"},
		{APIChat, `{"model":"m","stream_options":{"include_usage":1},"messages":[{"role":"user"}]}`, "stream_options.include_usage", "field 'stream_options.include_usage' must be a boolean, got number"},
		{APIChat, `{"model":"m","chat_template_kwargs":[],"messages":[{"role":"user"}]}`, "chat_template_kwargs", "field 'chat_template_kwargs' must be an object, got array"},
		{APIChat, `{"model":"m","tools":"x","messages":[{"role":"user"}]}`, "tools", "field 'tools' must be an array of objects, got string"},
		{APIChat, `{"model":"m","tools":[1],"messages":[{"role":"user"}]}`, "tools", "field 'tools' must be an array of objects, got an element of type number"},
		{APIChat, `[1,2]`, "", "request body must be a JSON object, got array"},
		{APIChat, `{"model":`, "", "request body is not valid JSON: unexpected end of JSON input (at byte 9)"},
		{APIChat, `{"model":x}`, "", "request body is not valid JSON: invalid character 'x' looking for beginning of value (at byte 10)"},
	} {
		_, err := Parse(c.api, []byte(c.body))
		e, ok := AsError(err)
		if !ok {
			t.Errorf("%q: err %v is not *Error", c.body, err)
			continue
		}
		if e.Status != http.StatusBadRequest || e.Param != c.param || e.Message != c.msg {
			t.Errorf("%q: got %d param %q %q, want param %q %q", c.body, e.Status, e.Param, e.Message, c.param, c.msg)
		}
		for _, leak := range []string{"Go struct", "wire", "interface", "map[", "[]"} {
			if strings.Contains(e.Message, leak) {
				t.Errorf("%q: message %q leaks %q", c.body, e.Message, leak)
			}
		}
	}
}
