package tokenize

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/request"
)

func fuzzChatSeeds(f *testing.F) {
	var corpus corpusFile
	readJSON(f, filepath.Join("testdata", "corpus.json"), &corpus)
	for _, c := range corpus.Chats {
		var m map[string]json.RawMessage
		if json.Unmarshal(c.Request, &m) != nil {
			continue
		}
		m["model"] = json.RawMessage(`"m"`)
		b, _ := json.Marshal(m)
		f.Add(false, b)
	}
	for _, s := range []string{
		`{"model":"m","max_tokens":10,"system":[{"type":"text","text":"x-anthropic-billing-header: a"},{"type":"text","text":"A."}],
		  "messages":[{"role":"user","content":[{"type":"text","text":"q"}]},
		  {"role":"assistant","content":[{"type":"thinking","thinking":"hmm"},{"type":"tool_use","id":"t","name":"f","input":{"b":1.0,"a":[1E3]}}]},
		  {"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"r1"}]}]}],
		  "tools":[{"name":"f","description":"d","input_schema":{"type":"object"}}]}`,
		`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`,
		`{"model":"m","max_tokens":1,"system":"s","messages":[{"role":"system","content":"s2"},{"role":"user","content":"u"}]}`,
	} {
		f.Add(true, []byte(s))
	}
}

// FuzzRenderChat: any chat or Anthropic body that parses renders (or fails with an
// error) without a panic, and rendering and tokenizing are deterministic, for a
// Qwen3 and a Llama 3.1 template.
func FuzzRenderChat(f *testing.F) {
	fuzzChatSeeds(f)
	ms := []*Model{loadFamily(f, "qwen3"), loadFamily(f, "llama3_1")}
	f.Fuzz(func(t *testing.T, anthropic bool, body []byte) {
		api := request.APIChat
		if anthropic {
			api = request.APIMessages
		}
		req, err := request.Parse(api, body)
		if err != nil {
			return
		}
		for _, m := range ms {
			a, errA := LocalTokens(m, req)
			b, errB := LocalTokens(m, req)
			if (errA == nil) != (errB == nil) {
				t.Fatalf("%s: not deterministic: %v / %v", m.Dir, errA, errB)
			}
			if errA != nil {
				if !errors.Is(errA, ErrTemplate) && !errors.Is(errA, ErrContent) && !errors.Is(errA, ErrNoTemplate) {
					t.Fatalf("%s: error %v is not a template/content error", m.Dir, errA)
				}
				continue
			}
			if len(a) != len(b) || !slices.Equal(a[0], b[0]) {
				t.Fatalf("%s: ids differ between two runs", m.Dir)
			}
		}
	})
}

// FuzzAnthropicToChat: the Anthropic → chat conversion never panics, is deterministic,
// and gives messages that each have a string role.
func FuzzAnthropicToChat(f *testing.F) {
	fuzzChatSeeds(f)
	f.Fuzz(func(t *testing.T, _ bool, body []byte) {
		req, err := request.Parse(request.APIMessages, body)
		if err != nil {
			return
		}
		a, errA := anthropicToChat(req.System, req.Messages)
		b, errB := anthropicToChat(req.System, req.Messages)
		if (errA == nil) != (errB == nil) || len(a) != len(b) {
			t.Fatalf("not deterministic: %v / %v", errA, errB)
		}
		for i := range a {
			if string(a[i].AppendJSON(nil)) != string(b[i].AppendJSON(nil)) {
				t.Fatalf("message %d differs between runs", i)
			}
			if _, ok := a[i].Field("role").Str(); !ok {
				t.Fatalf("message %d has no string role: %s", i, a[i].AppendJSON(nil))
			}
		}
	})
}
