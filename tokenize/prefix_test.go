package tokenize

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/request"
)

func parseChat(t *testing.T, v map[string]any) *request.Request {
	t.Helper()
	v["model"] = "m"
	b, _ := json.Marshal(v)
	r, err := request.Parse(request.APIChat, b)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func chatIDs(t *testing.T, m *Model, r *request.Request) []uint32 {
	t.Helper()
	text, err := m.RenderChat(r)
	if err != nil {
		t.Fatal(err)
	}
	return m.EncodeText(text, false)
}

// TestSharedPrefixBlocks: the index keys blocks chained from the start, so two requests
// of one conversation must give identical leading block keys for their common history,
// also when the later request adds tool calls and tool results.
func TestSharedPrefixBlocks(t *testing.T) {
	tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "lookup", "description": "Look a word up.",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"word": map[string]any{"type": "string"}}}}}}
	history := []any{
		map[string]any{"role": "system", "content": "You are a dictionary. " + strings.Repeat("Be precise and brief. ", 20)},
		map[string]any{"role": "user", "content": "What does 'serendipity' mean? " + strings.Repeat("Please explain in detail. ", 10)},
		map[string]any{"role": "assistant", "content": "Finding something good without looking for it."},
		map[string]any{"role": "user", "content": "Look up 'petrichor' with the tool."},
	}
	more := append(append([]any{}, history...),
		map[string]any{"role": "assistant", "content": "", "tool_calls": []any{map[string]any{"id": "c1", "type": "function",
			"function": map[string]any{"name": "lookup", "arguments": `{"word": "petrichor"}`}}}},
		map[string]any{"role": "tool", "tool_call_id": "c1", "content": "the smell of rain on dry ground"},
		map[string]any{"role": "user", "content": "Thanks. And 'sonder'?"},
	)
	for _, fam := range []string{"qwen3", "llama3_1", "deepseek_v3"} {
		t.Run(fam, func(t *testing.T) {
			m := loadFamily(t, fam)
			for _, withTools := range []bool{false, true} {
				a := map[string]any{"messages": history}
				b := map[string]any{"messages": more}
				if withTools {
					a["tools"], b["tools"] = tools, tools
				}
				// The history as the engine cached it: rendered without a generation prompt.
				hist := map[string]any{"messages": history, "add_generation_prompt": false}
				if withTools {
					hist["tools"] = tools
				}
				hIDs := chatIDs(t, m, parseChat(t, hist))
				aIDs, bIDs := chatIDs(t, m, parseChat(t, a)), chatIDs(t, m, parseChat(t, b))
				if d := firstDiff(aIDs[:len(hIDs)], hIDs); d >= 0 && d < len(hIDs) {
					t.Fatalf("tools=%v: request 1 does not start with its history's ids (diff at %d)", withTools, d)
				}
				if len(bIDs) < len(hIDs) || firstDiff(bIDs[:len(hIDs)], hIDs) >= 0 {
					t.Fatalf("tools=%v: request 2 does not start with the shared history's ids", withTools)
				}
				const bs = 16
				seed := kvindex.Namespace{Model: "m"}.Seed()
				ka := kvindex.HashBlocks(seed, aIDs, bs, nil)
				kb := kvindex.HashBlocks(seed, bIDs, bs, nil)
				shared := len(hIDs) / bs
				if shared < 4 {
					t.Fatalf("history too short for the test: %d blocks", shared)
				}
				for i := 0; i < shared; i++ {
					if ka[i] != kb[i] {
						t.Fatalf("tools=%v: block %d of %d shared blocks differs", withTools, i, shared)
					}
				}
			}
		})
	}
}

// TestSegmentCacheExact: ids built with cached segments (a conversation growing turn by
// turn) equal ids built with no cache at all, for every family; and the cache is bounded.
func TestSegmentCacheExact(t *testing.T) {
	text, err := os.ReadFile(filepath.Join("testdata", "long_mixed.txt"))
	if err != nil {
		t.Fatal(err)
	}
	paras := strings.Split(string(text), "\n\n")
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			base := loadFamily(t, fam)
			if base.ChatError() != nil {
				t.Skipf("%s has no chat template: %v", fam, base.ChatError())
			}
			cached := *base
			cached.cache = newSegmentCache(1<<20, 64)
			uncached := *base
			uncached.cache = nil
			first := "system"
			if base.IsHarmony() {
				first = "user" // harmony refuses system messages (see harmony.go)
			}
			msgs := []any{map[string]any{"role": first, "content": paras[0]}}
			for turn := 1; turn < 40; turn++ {
				role := "user"
				if turn%2 == 0 {
					role = "assistant"
				}
				msgs = append(msgs, map[string]any{"role": role, "content": fmt.Sprintf("%d: %s", turn, paras[turn%len(paras)])})
				r := parseChat(t, map[string]any{"messages": msgs})
				want := chatIDs(t, &uncached, r)
				got := chatIDs(t, &cached, r)
				if d := firstDiff(got, want); d >= 0 {
					t.Fatalf("turn %d: cached ids differ from uncached at %d", turn, d)
				}
			}
			st := cached.CacheStats()
			if st.Hits == 0 || st.Bytes > 1<<20 {
				t.Errorf("cache stats %+v: want hits from earlier turns and size within the 1 MiB bound", st)
			}
			// Completion prompts go through the same cache.
			p := paras[3] + paras[4]
			if d := firstDiff(cached.EncodeText(p, true), uncached.EncodeText(p, true)); d >= 0 {
				t.Errorf("completion prompt: cached ids differ at %d", d)
			}
		})
	}
}

func TestSegmentCacheBound(t *testing.T) {
	c := newSegmentCache(4*100+entryOverhead, 1)
	ids := make([]uint32, 100)
	c.put("a", ids)
	c.put("b", ids) // evicts "a"
	if _, ok := c.get("a"); ok {
		t.Error("the least recently used entry must be evicted when the byte bound is exceeded")
	}
	if _, ok := c.get("b"); !ok {
		t.Error("the newest entry must stay")
	}
	c.put("huge", make([]uint32, 1000)) // larger than the bound: never stored
	if _, ok := c.get("huge"); ok || c.bytes > c.limit {
		t.Errorf("an entry above the bound must not be stored (bytes %d, limit %d)", c.bytes, c.limit)
	}
}
