package tokenize

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/jsonvalue"
	"github.com/kvroute/kvroute/metrics"
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

// withTemplate returns fam's tokenizer with src as its chat template and a fresh
// render cache (its default proof made).
func withTemplate(t *testing.T, fam, src string) *Model {
	t.Helper()
	m := freshFamily(t, fam)
	ct, err := compileChatTemplate(src)
	if err != nil {
		t.Fatal(err)
	}
	m.chat = ct
	m.render = newRenderCache(DefaultRenderCacheBytes)
	plain := &request.Request{API: request.APIChat}
	c, err := m.prepareChat(plain)
	if err != nil {
		t.Fatal(err)
	}
	m.render.proofs[contextHash(plain)] = m.prove(c.vars)
	return m
}

// freshFamily loads fam's tokenizer anew (not shared with other tests).
func freshFamily(t *testing.T, fam string) *Model {
	t.Helper()
	loadFamily(t, fam) // skips without the files
	m, err := LoadModel(filepath.Join(tokenizersDir(), fam), Options{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestIncrementalGoldens: every family's golden chats and each of their prefixes give
// the reference ids through the cached path, sent twice (the second time from the
// cache where the cut is proven).
func TestIncrementalGoldens(t *testing.T) {
	var corpus corpusFile
	readJSON(t, "testdata/corpus.json", &corpus)
	for _, fam := range chatFamilies {
		t.Run(fam, func(t *testing.T) {
			var g goldenFile
			readJSON(t, "testdata/golden/"+fam+".json", &g)
			m := loadFamily(t, fam)
			for _, want := range g.Chats {
				if want.Error != "" {
					continue
				}
				req := chatRequestByName(t, &corpus, want.Name)
				for pass := range 2 {
					got, err := cachedIDs(m, req)
					if err != nil {
						t.Fatalf("chat %s: %v", want.Name, err)
					}
					if d := firstDiff(got, want.IDs); d >= 0 {
						t.Fatalf("chat %s pass %d: ids differ at %d", want.Name, pass, d)
					}
				}
			}
		})
	}
}

// TestUnprovenTemplateRendersInFull: a template whose every message shows the
// conversation's length is never a prefix of the next turn's render; the proof finds
// no exact cut, so every turn is rendered in full and stays exact.
func TestUnprovenTemplateRendersInFull(t *testing.T) {
	m := withTemplate(t, "qwen3", "{% for m in messages %}<|im_start|>{{ m.role }} {{ messages|length }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
	msgs := agentConversation(rand.New(rand.NewPCG(3, 4)), 10, false, false, true)
	for n := 1; n <= len(msgs); n++ {
		req := reqOf(t, msgs[:n], nil)
		want, _ := uncachedIDs(t, m, req)
		got, err := cachedIDs(m, req)
		if err != nil || firstDiff(got, want) >= 0 {
			t.Fatalf("n=%d: cached ids differ from the full render (err %v)", n, err)
		}
	}
	if st := m.RenderCacheStats(); st.Hits != 0 {
		t.Errorf("a template that is not prefix-stable was served from the cache: %+v", st)
	}
}

// TestSelfCheckTurnsCacheOff: a cached prefix that no longer matches what the template
// renders (here: tampered with) is caught by the sampled self-check, counted, and the
// model renders in full from then on.
func TestSelfCheckTurnsCacheOff(t *testing.T) {
	m := freshFamily(t, "qwen3")
	msgs := agentConversation(rand.New(rand.NewPCG(5, 6)), 8, false, false, true)
	if _, err := cachedIDs(m, reqOf(t, msgs[:len(msgs)-1], nil)); err != nil {
		t.Fatal(err)
	}
	m.render.mu.Lock()
	for _, el := range m.render.items {
		e := el.Value.(*renderEntry)
		if e.parent == nil {
			e.text = strings.Replace(e.text, "You are an agent.", "You are an agenT.", 1)
		}
	}
	m.render.mu.Unlock()
	req := reqOf(t, msgs, nil)
	if _, err := cachedIDs(m, req); err != nil { // served from the tampered entry, checked
		t.Fatal(err)
	}
	m.render.proofWG.Wait()
	st := m.RenderCacheStats()
	if st.Hits != 1 || st.Checks != 1 || st.Disagreements != 1 || !st.Off {
		t.Fatalf("want one hit, checked and found different, cache off: %+v", st)
	}
	want, _ := uncachedIDs(t, m, req)
	got, err := cachedIDs(m, req)
	if err != nil || firstDiff(got, want) >= 0 {
		t.Fatalf("after the cache turned off, ids differ from the full render (err %v)", err)
	}
}

// TestTemplateLiteralsAreOdd: Qwen3 tests assistant text for '</think>'; a message
// containing it is rendered in full.
func TestTemplateLiteralsAreOdd(t *testing.T) {
	m := loadFamily(t, "qwen3")
	lits := m.chat.lits
	if !slices.Contains(lits, "</think>") || !slices.Contains(lits, "<tool_response>") {
		t.Fatalf("literals %q miss </think> or <tool_response>", lits)
	}
	odd := jsonvalue.MessagesOf([]map[string]any{{"role": "assistant", "content": "a</think>b"}})[0]
	plain := jsonvalue.MessagesOf([]map[string]any{{"role": "assistant", "content": "ab"}})[0]
	if messageFeatures(1, odd, lits)&featOdd == 0 || messageFeatures(1, plain, lits) != 0 {
		t.Fatalf("features: odd %b plain %b", messageFeatures(1, odd, lits), messageFeatures(1, plain, lits))
	}
}

// TestRenderCacheBounded: the cache holds at most its byte bound.
func TestRenderCacheBounded(t *testing.T) {
	c := newRenderCache(10_000)
	for i := range 100 {
		c.put(&renderEntry{key: renderKey{n: i}, text: strings.Repeat("x", 1000), textLen: 1000})
	}
	st := (&Model{render: c}).RenderCacheStats()
	if st.Bytes > 10_000 || st.Entries == 0 || st.Evictions == 0 || c.get(renderKey{n: 99}) == nil || c.get(renderKey{n: 0}) != nil {
		t.Fatalf("bound 10000: %+v", st)
	}
}

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

// TestIncrementalLongConversation: past maxDepth turns an entry is stored flat; every
// turn of a 120-message conversation still gives the full render's ids, nearly all
// from the cache.
func TestIncrementalLongConversation(t *testing.T) {
	m := freshFamily(t, "llama3_1")
	msgs := agentConversation(rand.New(rand.NewPCG(7, 8)), 120, false, false, true)
	for n := 2; n <= len(msgs); n++ {
		req := reqOf(t, msgs[:n], nil)
		want, _ := uncachedIDs(t, m, req)
		got, err := cachedIDs(m, req)
		if err != nil || firstDiff(got, want) >= 0 {
			t.Fatalf("n=%d: cached ids differ from the full render (err %v)", n, err)
		}
	}
	m.render.proofWG.Wait()
	st := m.RenderCacheStats()
	if st.Hits < int64(len(msgs))-10 || st.Disagreements != 0 {
		t.Fatalf("long conversation: %+v", st)
	}
	deepest := 0
	m.render.mu.Lock()
	for _, el := range m.render.items {
		deepest = max(deepest, el.Value.(*renderEntry).depth)
	}
	m.render.mu.Unlock()
	if deepest > maxDepth {
		t.Fatalf("an entry is %d parents deep (bound %d)", deepest, maxDepth)
	}
}

// TestIncrementalConcurrent: goroutines growing conversations at once, two of them
// the same conversation, share one render cache and each gets the full render's ids.
func TestIncrementalConcurrent(t *testing.T) {
	m := freshFamily(t, "qwen3")
	convs := make([][]map[string]any, 4)
	for i := range convs {
		convs[i] = agentConversation(rand.New(rand.NewPCG(9, uint64(i%3))), 12, i%2 == 1, false, true)
	}
	type result struct {
		n        int
		got, exp []uint32
		err      error
	}
	reqs := make([][]*request.Request, len(convs))
	wants := make([][][]uint32, len(convs))
	for i, msgs := range convs {
		for n := 1; n <= len(msgs); n++ {
			extra := map[string]any{}
			if i%2 == 1 {
				extra["tools"] = probeTools
			}
			req := reqOf(t, msgs[:n], extra)
			want, _ := uncachedIDs(t, m, req)
			reqs[i], wants[i] = append(reqs[i], req), append(wants[i], want)
		}
	}
	out := make(chan result, 64)
	for i := range convs {
		go func() {
			for j, req := range reqs[i] {
				got, err := cachedIDs(m, req)
				out <- result{j + 1, got, wants[i][j], err}
			}
		}()
	}
	for range len(convs) * len(reqs[0]) {
		r := <-out
		if r.err != nil || firstDiff(r.got, r.exp) >= 0 {
			t.Fatalf("n=%d: cached ids differ from the full render (err %v)", r.n, r.err)
		}
	}
	m.render.proofWG.Wait()
	if st := m.RenderCacheStats(); st.Disagreements != 0 {
		t.Fatalf("self-check disagreed: %+v", st)
	}
}

// TestIncrementalAnthropic: a /v1/messages conversation (system blocks, tool_use,
// tool_result) grown turn by turn gives the full render's ids through the cache.
func TestIncrementalAnthropic(t *testing.T) {
	m := freshFamily(t, "qwen3")
	turns := []string{
		`{"role":"user","content":"Weather in Oslo?"}`,
		`{"role":"assistant","content":[{"type":"text","text":"Checking."},{"type":"tool_use","id":"t1","name":"get_weather","input":{"city":"Oslo"}}]}`,
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"-3 C"}]}]}`,
		`{"role":"assistant","content":"It is -3 C in Oslo."}`,
		`{"role":"user","content":[{"type":"text","text":"And in Bergen?"}]}`,
		`{"role":"assistant","content":[{"type":"text","text":"Checking."},{"type":"tool_use","id":"t2","name":"get_weather","input":{"city":"Bergen"}}]}`,
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t2","content":"4 C"}]}`,
		`{"role":"assistant","content":"4 C in Bergen."}`,
		`{"role":"user","content":"Thanks"}`,
	}
	for n := 1; n <= len(turns); n++ {
		for pass := range 2 {
			req, err := request.Parse(request.APIMessages, []byte(`{"model":"m","max_tokens":10,"system":[{"type":"text","text":"Be brief."}],`+
				`"tools":[{"name":"get_weather","description":"Weather.","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],`+
				`"messages":[`+strings.Join(turns[:n], ",")+`]}`))
			if err != nil {
				t.Fatal(err)
			}
			want, werr := uncachedIDs(t, m, req)
			got, gerr := cachedIDs(m, req)
			if (werr == nil) != (gerr == nil) || firstDiff(got, want) >= 0 {
				t.Fatalf("n=%d pass %d: cached ids differ from the full render (errors %v / %v)", n, pass, werr, gerr)
			}
			m.render.proofWG.Wait() // the tools' proof, made in the background
		}
	}
	if st := m.RenderCacheStats(); st.Hits == 0 || st.Disagreements != 0 {
		t.Fatalf("anthropic conversation: %+v", st)
	}
}

// TestTemplateClock: a template writing today's date keys the cache by the date; one
// writing the time of day is never cached.
func TestTemplateClock(t *testing.T) {
	for src, want := range map[string]uint8{
		`{{ messages[0].content }}`:                         clockNone,
		`{%- set date_string = strftime_now("%d %b %Y") %}`: clockDate,
		`{{ strftime_now("%Y-%m-%d %H:%M") }}`:              clockTime,
	} {
		if got := templateClock(src); got != want {
			t.Errorf("%s: clock %d, want %d", src, got, want)
		}
	}
	m := withTemplate(t, "qwen3", `{{ strftime_now("%H:%M:%S") }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}`)
	msgs := agentConversation(rand.New(rand.NewPCG(3, 4)), 6, false, false, true)
	for n := 1; n <= len(msgs); n++ {
		if _, err := cachedIDs(m, reqOf(t, msgs[:n], nil)); err != nil {
			t.Fatal(err)
		}
	}
	if st := m.RenderCacheStats(); st.Hits != 0 || st.Stores != 0 {
		t.Fatalf("a time-of-day template used the cache: %+v", st)
	}
}

// TestProofOnlyForInputsThatComeBack: tools sent once never cost a proof; the second
// request with the same tools starts one, after which the cache serves them.
func TestProofOnlyForInputsThatComeBack(t *testing.T) {
	m := freshFamily(t, "qwen3")
	msgs := agentConversation(rand.New(rand.NewPCG(11, 12)), 4, false, false, true)
	proofs := func() int {
		m.render.proofWG.Wait()
		m.render.proofMu.Lock()
		defer m.render.proofMu.Unlock()
		return len(m.render.proofs)
	}
	base := proofs()
	for i := range 20 {
		tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": fmt.Sprintf("fn%d", i), "parameters": map[string]any{}}}}
		if _, err := cachedIDs(m, reqOf(t, msgs, map[string]any{"tools": tools})); err != nil {
			t.Fatal(err)
		}
	}
	if n := proofs(); n != base {
		t.Fatalf("20 tool sets seen once made %d proofs", n-base)
	}
	extra := map[string]any{"tools": probeTools}
	for n := 1; n <= len(msgs); n++ {
		if _, err := cachedIDs(m, reqOf(t, msgs[:n], extra)); err != nil {
			t.Fatal(err)
		}
		proofs()
	}
	if n := proofs(); n != base+1 {
		t.Fatalf("tools that came back: %d proofs, want %d", n, base+1)
	}
	if st := m.RenderCacheStats(); st.Hits == 0 {
		t.Fatalf("no hit once the tools were proven: %+v", st)
	}
}

// The render cache's counters reach the client_golang metrics (observeCache, after
// each local tokenization): a conversation tokenized turn by turn through the Service
// shows the hits, misses and bytes RenderCacheStats reports, and no disagreement; the
// segment cache's hits and misses are its CacheStats'.
func TestRenderCacheMetrics(t *testing.T) {
	m := loadFamily(t, "qwen3")
	if m.render == nil {
		t.Skip("qwen3: no render cache")
	}
	ms := metrics.NewUnregistered().Tokenize
	s, err := NewService(ServiceOptions{Models: []ModelConfig{{Name: "qwen3", Model: m, Paths: []Path{PathLocal}}}, Metrics: ms})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for turn := range 6 {
		role := "user"
		if turn%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, fmt.Sprintf(`{"role":%q,"content":"turn %d: %s"}`, role, turn, strings.Repeat("words ", 40)))
		if role != "user" {
			continue
		}
		req, err := request.Parse(request.APIChat, []byte(`{"model":"qwen3","messages":[`+strings.Join(msgs, ",")+`]}`))
		if err != nil {
			t.Fatal(err)
		}
		if res, err := s.Tokenize(context.Background(), req); err != nil || res.Path != PathLocal {
			t.Fatalf("turn %d: %+v, %v", turn, res, err)
		}
		m.render.proofWG.Wait() // the template's proof, made in the background
	}
	st := m.RenderCacheStats()
	if st.Hits == 0 || st.Misses == 0 || st.Bytes == 0 {
		t.Fatalf("render cache %+v: want hits, misses and bytes", st)
	}
	for what, pair := range map[string][2]float64{
		"hits":          {testutil.ToFloat64(ms.RenderHits.WithLabelValues("qwen3")), float64(st.Hits)},
		"misses":        {testutil.ToFloat64(ms.RenderMisses.WithLabelValues("qwen3")), float64(st.Misses)},
		"bytes":         {testutil.ToFloat64(ms.RenderBytes.WithLabelValues("qwen3")), float64(st.Bytes)},
		"disagreements": {testutil.ToFloat64(ms.RenderDisagreements.WithLabelValues("qwen3")), 0},
		"off":           {testutil.ToFloat64(ms.RenderOff.WithLabelValues("qwen3")), 0},
		// the segment cache's, moved by the same loop
		"segment hits":   {testutil.ToFloat64(ms.CacheHits.WithLabelValues("qwen3")), float64(m.CacheStats().Hits)},
		"segment misses": {testutil.ToFloat64(ms.CacheMisses.WithLabelValues("qwen3")), float64(m.CacheStats().Misses)},
	} {
		if pair[0] != pair[1] {
			t.Errorf("render cache %s: metric %v, stats %v", what, pair[0], pair[1])
		}
	}
}
