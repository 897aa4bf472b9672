package tokenize

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/jsonvalue"
	"github.com/kvroute/kvroute/request"
)

// chatFamilies are the families rendered by a Jinja template (gpt-oss uses harmony).
var chatFamilies = []string{"qwen3", "llama3", "llama3_1", "deepseek_v3", "gemma3", "llama2"}

// uncachedIDs is the reference: the full render, then EncodeText.
func uncachedIDs(t *testing.T, m *Model, req *request.Request) ([]uint32, error) {
	t.Helper()
	text, err := m.RenderChat(req)
	if err != nil {
		return nil, err
	}
	add := false
	if req.AddSpecialTokens != nil {
		add = *req.AddSpecialTokens
	}
	return m.EncodeText(text, add), nil
}

func cachedIDs(m *Model, req *request.Request) ([]uint32, error) {
	idss, err := LocalTokens(m, req)
	if err != nil {
		return nil, err
	}
	return idss[0], nil
}

func reqOf(t *testing.T, msgs []map[string]any, extra map[string]any) *request.Request {
	t.Helper()
	v := map[string]any{"messages": msgs}
	for k, x := range extra {
		v[k] = x
	}
	return parseChat(t, v)
}

// agentConversation builds a conversation of turns messages as an agent grows one:
// a system prompt, user questions, assistant answers, tool calls and results,
// reasoning on some assistant turns when reasoning is set. Texts come from r.
func agentConversation(r *rand.Rand, turns int, tools, reasoning, system bool) []map[string]any {
	words := strings.Fields("the model routes each request to a worker whose cache holds the longest prefix of its prompt " +
		"tokens blocks hashes events index prefill decode latency queue load score pick, . ; : ! ? \n\n  ( ) [ ] 123 4.5 é ü 中文 🙂")
	text := func(n int) string {
		var sb strings.Builder
		for i := range n {
			if i > 0 {
				sb.WriteByte(' ')
			}
			sb.WriteString(words[r.IntN(len(words))])
		}
		return sb.String()
	}
	var msgs []map[string]any
	if system {
		msgs = append(msgs, map[string]any{"role": "system", "content": "You are an agent. " + text(40)})
	}
	call := 0
	for len(msgs) < turns {
		msgs = append(msgs, map[string]any{"role": "user", "content": text(5 + r.IntN(60))})
		a := map[string]any{"role": "assistant", "content": text(5 + r.IntN(80))}
		if reasoning && r.IntN(2) == 0 {
			a["reasoning_content"] = text(10)
		}
		if tools && r.IntN(2) == 0 {
			call++
			id := fmt.Sprintf("call_%d", call)
			a["tool_calls"] = []any{map[string]any{"id": id, "type": "function",
				"function": map[string]any{"name": "lookup", "arguments": fmt.Sprintf(`{"q": %q}`, text(3))}}}
			msgs = append(msgs, a, map[string]any{"role": "tool", "tool_call_id": id, "content": text(20)})
			a = map[string]any{"role": "assistant", "content": text(10)}
		}
		msgs = append(msgs, a)
	}
	return msgs
}

var probeTools = []any{map[string]any{"type": "function", "function": map[string]any{"name": "lookup", "description": "Look a word up.",
	"parameters": map[string]any{"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string"}}}}}}

// TestIncrementalMatchesFull sends every family a growing conversation one request per
// message (ending in user, assistant and tool messages, with and without tools,
// reasoning and a system prompt) and checks that the cached path gives exactly the
// ids of a full render for each, and that the cache served some of them.
func TestIncrementalMatchesFull(t *testing.T) {
	for _, fam := range chatFamilies {
		t.Run(fam, func(t *testing.T) {
			m := loadFamily(t, fam)
			if m.render == nil {
				t.Skipf("%s: no chat template", fam)
			}
			r := rand.New(rand.NewPCG(1, 2))
			for _, shape := range []struct{ tools, reasoning, system bool }{{false, false, true}, {false, false, false}, {true, false, true}, {false, true, true}, {true, true, false}} {
				msgs := agentConversation(r, 16, shape.tools, shape.reasoning, shape.system)
				extra := map[string]any{}
				if shape.tools {
					extra["tools"] = probeTools
				}
				for n := 1; n <= len(msgs); n++ {
					for _, agp := range []bool{true, false} {
						extra["add_generation_prompt"] = agp
						req := reqOf(t, msgs[:n], extra)
						want, werr := uncachedIDs(t, m, req)
						got, gerr := cachedIDs(m, req)
						if (werr == nil) != (gerr == nil) {
							t.Fatalf("%+v n=%d agp=%v: full error %v, cached error %v", shape, n, agp, werr, gerr)
						}
						if d := firstDiff(got, want); d >= 0 {
							wt, _ := m.RenderChat(req)
							t.Logf("full:\n%q\ncached:\n%q", wt, m.decodeForTest(got))
							t.Fatalf("%+v n=%d agp=%v: ids differ at %d (of %d/%d)", shape, n, agp, d, len(got), len(want))
						}
					}
				}
				m.render.proofWG.Wait()
			}
			st := m.RenderCacheStats()
			t.Logf("%s: %+v", fam, st)
			if st.Hits == 0 {
				t.Errorf("%s: the render cache served nothing: %+v", fam, st)
			}
			if st.Disagreements != 0 || st.Off {
				t.Errorf("%s: self-check disagreed: %+v", fam, st)
			}
		})
	}
}

var _ = jsonvalue.Null

func (m *Model) decodeForTest(ids []uint32) string {
	inv := map[uint32]string{}
	for i := range ids {
		if s, ok := m.names[ids[i]]; ok {
			inv[ids[i]] = s
		}
	}
	var sb strings.Builder
	for _, id := range ids {
		if s, ok := inv[id]; ok {
			sb.WriteString(s)
		} else {
			fmt.Fprintf(&sb, "·%d", id)
		}
	}
	return sb.String()
}
