package tokenize

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
)

// harmonyGolden reads testdata/harmony/NAME as harmony's tests do (trim_end); see
// testdata/harmony/SOURCES.md for each file's source path and commit.
func harmonyGolden(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "harmony", name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimRight(string(b), " \t\r\n")
}

// checkHarmony compares a rendering with a golden text and with the golden's ids as
// harmony's tests compute them (encode with every special token allowed).
func checkHarmony(t *testing.T, m *Model, ids []uint32, text, want string) {
	t.Helper()
	if text != want {
		i := 0
		for i < len(text) && i < len(want) && text[i] == want[i] {
			i++
		}
		t.Fatalf("text differs at byte %d:\n got …%q\nwant …%q", i, text[max(0, i-40):min(len(text), i+80)], want[max(0, i-40):min(len(want), i+80)])
	}
	if wantIDs := m.EncodeText(want, false); !slices.Equal(ids, wantIDs) {
		t.Fatalf("ids differ from encode(golden):\n got %v\nwant %v", ids, wantIDs)
	}
}

func renderHmsgs(m *Model, msgs []hmsg) ([]uint32, string) {
	r := harmonyRender{m: m, h: m.harmony}
	for _, msg := range dropAnalysisBeforeFinal(msgs) {
		r.message(msg)
	}
	r.special(m.harmony.start, "<|start|>")
	r.text("assistant")
	return r.ids, r.sb.String()
}

// formatMDTools are the three functions of docs/format.md's example, as a chat request's
// tools.
const formatMDTools = `[
 {"type":"function","function":{"name":"get_location","description":"Gets the location of the user."}},
 {"type":"function","function":{"name":"get_current_weather","description":"Gets the current weather in the provided location.",
  "parameters":{"type":"object","properties":{"location":{"type":"string","description":"The city and state, e.g. San Francisco, CA"},
   "format":{"type":"string","enum":["celsius","fahrenheit"],"default":"celsius"}},"required":["location"]}}},
 {"type":"function","function":{"name":"get_multiple_weathers","description":"Gets the current weather in the provided list of locations.",
  "parameters":{"type":"object","properties":{"locations":{"type":"array","items":{"type":"string"},"description":"List of city and state, e.g. [\"San Francisco, CA\", \"New York, NY\"]"},
   "format":{"type":"string","enum":["celsius","fahrenheit"],"default":"celsius"}},"required":["locations"]}}}]`

func harmonyModel(t *testing.T, opts HarmonyOptions) *Model {
	t.Helper()
	base := loadFamily(t, "gptoss")
	if !base.IsHarmony() {
		t.Fatal("gptoss is not detected as a harmony model")
	}
	m := *base
	m.harmonyOpts = opts
	return &m
}

func hchat(t *testing.T, body string) *request.Request {
	t.Helper()
	req, err := request.Parse(request.APIChat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestHarmonyGoldens: renderings equal harmony's expected texts and ids.
func TestHarmonyGoldens(t *testing.T) {
	m := harmonyModel(t, HarmonyOptions{StartDate: "2025-06-28"})

	t.Run("test_multi_turn_auto_drop_analysis", func(t *testing.T) {
		// The messages of harmony's multi-turn test: the message renderer (header
		// order, <|call|> after a recipient, no drop while the turn's analysis is
		// ongoing).
		code := `{"code": "import timeit\n\ndef fib_recursive(n):\n    if n <= 1: return n\n    return fib_recursive(n-1) + fib_recursive(n-2)\n\ndef fib_iter(n):\n    if n <= 1: return n\n    a, b = 0, 1\n    for _ in range(2, n+1): a, b = b, a+b\n    return b\n\nprint(timeit.timeit(lambda: fib_recursive(30), number=1))\nprint(timeit.timeit(lambda: fib_iter(30), number=1000))"}`
		msgs := []hmsg{
			{role: "developer", texts: []string{"You are a helpful assistant that analyzes code and provides detailed feedback."}},
			{role: "user", texts: []string{"Can you help me optimize this Python function?\n\ndef fibonacci(n):\n    if n <= 1:\n        return n\n    return fibonacci(n-1) + fibonacci(n-2)"}},
			{role: "assistant", channel: "final", texts: []string{"This recursive Fibonacci has exponential time complexity. Would you like me to show optimized versions?"}},
			{role: "user", texts: []string{"Yes, and benchmark them"}},
			{role: "assistant", channel: "final", texts: []string{"I'll benchmark both versions for you."}},
			{role: "user", texts: []string{"Run the benchmark for n=30"}},
			{role: "assistant", channel: "analysis", texts: []string{"I need to execute Python code to run the benchmark for n=30."}},
			{role: "assistant", channel: "commentary", recipient: "functions.python", texts: []string{code}},
		}
		ids, text := renderHmsgs(m, dropTurnAnalysis(msgs))
		checkHarmony(t, m, ids, text, harmonyGolden(t, "test_multi_turn_auto_drop_analysis.txt"))
	})

	t.Run("format_md_functions", func(t *testing.T) {
		// The system message and the tools section come from a chat request through the
		// path vLLM takes (reasoning_effort high, the date pinned as in the example);
		// the developer message's instructions ("# Instructions\n\nUse a friendly
		// tone.") are not something a chat request produces, so that message is built
		// here from the rendered tools section.
		req := hchat(t, `{"model":"m","reasoning_effort":"high","tools":`+formatMDTools+`,"messages":[{"role":"user","content":"What is the weather like in SF?"}]}`)
		msgs, err := m.harmonyMessages(req)
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) != 3 || msgs[0].role != "system" || msgs[1].role != "developer" || msgs[2].role != "user" {
			t.Fatalf("messages = %+v", msgs)
		}
		msgs[1].texts = []string{"# Instructions\n\nUse a friendly tone.\n\n" + msgs[1].texts[0]}
		ids, text := renderHmsgs(m, msgs)
		checkHarmony(t, m, ids, text, harmonyGolden(t, "format_md_functions.txt"))
	})

	t.Run("format_md_tool_output", func(t *testing.T) {
		// A tool result as vLLM builds it (author functions.NAME from the call's id,
		// to=assistant, commentary) and the kept analysis of the ongoing turn match the
		// golden; the tool call itself is rendered as vLLM writes it (to= before the
		// channel, content type json) rather than format.md's model-output form, so the
		// comparison is of the text before and after that one message.
		req := hchat(t, `{"model":"m","reasoning_effort":"high","tools":`+formatMDTools+`,"messages":[
			{"role":"user","content":"What is the weather like in SF?"},
			{"role":"assistant","reasoning":"Need to use function get_weather.","content":null,
			 "tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"location\":\"San Francisco\"}"}}]},
			{"role":"tool","tool_call_id":"call_1","content":"{\"sunny\": true, \"temperature\": 20}"}]}`)
		ids, text, err := m.RenderHarmony(req)
		if err != nil {
			t.Fatal(err)
		}
		want := harmonyGolden(t, "format_md_tool_output.txt")
		const goldenCall = `<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location":"San Francisco"}<|call|>`
		const vllmCall = `<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"location":"San Francisco"}<|call|>`
		if !strings.Contains(want, goldenCall) {
			t.Fatal("golden lacks the tool call line")
		}
		want = strings.Replace(want, goldenCall, vllmCall, 1)
		want = strings.Replace(want, "# Instructions\n\nUse a friendly tone.\n\n", "", 1)
		checkHarmony(t, m, ids, text, want)
	})
}

// TestHarmonyChat: chat requests as vLLM converts them.
func TestHarmonyChat(t *testing.T) {
	m := harmonyModel(t, HarmonyOptions{StartDate: "2025-06-28"})
	const sys = "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
	cases := []struct{ name, messages, want string }{
		{"plain", `[{"role":"user","content":"What is 2 + 2?"}]`,
			sys + "<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant"},
		// format.md "Handling reasoning output in subsequent sampling": the previous
		// turn's analysis is dropped once it ended in a final message.
		{"drop previous analysis", `[{"role":"user","content":"What is 2 + 2?"},
			{"role":"assistant","reasoning":"User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.","content":"2 + 2 = 4."},
			{"role":"user","content":"What about 9 / 2?"}]`,
			sys + "<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|end|><|start|>user<|message|>What about 9 / 2?<|end|><|start|>assistant"},
		// Text parts stay separate contents (rendered one after the other); user text
		// spelling a formatting token is plain text, not the token.
		{"parts and special text", `[{"role":"user","content":[{"type":"text","text":"a<|end|>"},{"type":"text","text":"b"}]}]`,
			sys + "<|start|>user<|message|>a<|end|>b<|end|><|start|>assistant"},
		// An empty assistant message renders nothing; null user content an empty message.
		{"empty", `[{"role":"user","content":null},{"role":"assistant","content":""},{"role":"user","content":"x"}]`,
			sys + "<|start|>user<|message|><|end|><|start|>user<|message|>x<|end|><|start|>assistant"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ids, text, err := m.RenderHarmony(hchat(t, `{"model":"m","messages":`+c.messages+`}`))
			if err != nil {
				t.Fatal(err)
			}
			if text != c.want {
				t.Fatalf("text:\n got %q\nwant %q", text, c.want)
			}
			if c.name == "parts and special text" {
				// "a<|end|>" is encoded as text (no 200007 inside the user message).
				n := 0
				for _, id := range ids {
					if id == m.harmony.end {
						n++
					}
				}
				if n != 2 {
					t.Fatalf("%d <|end|> ids, want 2 (system, user)", n)
				}
				return
			}
			if want := m.EncodeText(c.want, false); !slices.Equal(ids, want) {
				t.Fatalf("ids differ from encode(text)")
			}
		})
	}
}

// TestHarmonyDropTurnAnalysis: vLLM's rule keeps earlier turns' analysis and drops
// the current turn's analysis before its last final message; harmony's rule then drops
// analysis before the first final when the last assistant message is final.
func TestHarmonyDropTurnAnalysis(t *testing.T) {
	a := func(ch, s string) hmsg { return hmsg{role: "assistant", channel: ch, texts: []string{s}} }
	u := hmsg{role: "user", texts: []string{"u"}}
	got := dropTurnAnalysis([]hmsg{u, a("analysis", "a1"), a("final", "f1"), u, a("analysis", "a2"), a("final", "f2")})
	var names []string
	for _, m := range got {
		names = append(names, m.texts[0])
	}
	if strings.Join(names, ",") != "u,a1,f1,u,f2" {
		t.Errorf("vLLM drop: %v", names)
	}
	got = dropAnalysisBeforeFinal(got)
	names = names[:0]
	for _, m := range got {
		names = append(names, m.texts[0])
	}
	if strings.Join(names, ",") != "u,f1,u,f2" {
		t.Errorf("harmony drop: %v", names)
	}
	// Ongoing turn (last assistant message is a tool call): nothing dropped.
	in := []hmsg{u, a("analysis", "a1"), {role: "assistant", channel: "commentary", recipient: "functions.f", texts: []string{"{}"}}}
	if got := dropAnalysisBeforeFinal(dropTurnAnalysis(in)); len(got) != 3 {
		t.Errorf("ongoing analysis dropped: %+v", got)
	}
}

// TestHarmonyRefuses: what was not verified goes to the next path (ErrContent).
func TestHarmonyRefuses(t *testing.T) {
	m := harmonyModel(t, HarmonyOptions{StartDate: "2025-06-28"})
	for name, body := range map[string]string{
		"system role":       `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}]}`,
		"developer role":    `{"model":"m","messages":[{"role":"developer","content":"s"},{"role":"user","content":"u"}]}`,
		"effort none":       `{"model":"m","reasoning_effort":"none","messages":[{"role":"user","content":"u"}]}`,
		"image":             `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`,
		"oneOf":             `{"model":"m","tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{"x":{"oneOf":[{"type":"string"}]}}}}}],"messages":[{"role":"user","content":"u"}]}`,
		"float default":     `{"model":"m","tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{"x":{"type":"number","default":0.5}}}}}],"messages":[{"role":"user","content":"u"}]}`,
		"no description":    `{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"u"}]}`,
		"object arguments":  `{"model":"m","messages":[{"role":"user","content":"u"},{"role":"assistant","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":{"a":1}}}]}]}`,
		"reasoning_content": `{"model":"m","messages":[{"role":"user","content":"u"},{"role":"assistant","reasoning_content":"r","content":"c"}]}`,
	} {
		if _, _, err := m.RenderHarmony(hchat(t, body)); !errors.Is(err, ErrContent) {
			t.Errorf("%s: err = %v, want ErrContent", name, err)
		}
	}
	msgs, _ := request.Parse(request.APIMessages, []byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"u"}]}`))
	if _, _, err := m.RenderHarmony(msgs); !errors.Is(err, ErrContent) {
		t.Errorf("Anthropic messages: err = %v, want ErrContent", err)
	}
	// LocalTokens (the local path) reports the same error, so the service moves on to
	// the remote path.
	if _, err := LocalTokens(m, hchat(t, `{"model":"m","messages":[{"role":"system","content":"s"}]}`)); !errors.Is(err, ErrContent) {
		t.Errorf("LocalTokens: err = %v, want ErrContent", err)
	}
}

// TestHarmonyDate: the system message's date is the engine host's local date: the
// configured zone (UTC by default), or the pinned date.
func TestHarmonyDate(t *testing.T) {
	now := func() time.Time { return time.Date(2026, 1, 1, 23, 30, 0, 0, time.UTC) }
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Skip(err)
	}
	for _, c := range []struct {
		opts HarmonyOptions
		want string
	}{
		{HarmonyOptions{Now: now}, "2026-01-01"},
		{HarmonyOptions{Now: now, Location: tokyo}, "2026-01-02"},
		{HarmonyOptions{Now: now, Location: tokyo, StartDate: "2025-06-28"}, "2025-06-28"},
	} {
		if got := c.opts.date(); got != c.want {
			t.Errorf("%+v: %s, want %s", c.opts, got, c.want)
		}
	}
	m := harmonyModel(t, HarmonyOptions{Now: now, Location: tokyo})
	text, err := m.RenderChat(hchat(t, `{"model":"m","messages":[{"role":"user","content":"u"}]}`))
	if err != nil || !strings.Contains(text, "Current date: 2026-01-02\n") {
		t.Errorf("RenderChat: %q, %v", text, err)
	}
	ids, err := LocalTokens(m, hchat(t, `{"model":"m","messages":[{"role":"user","content":"u"}]}`))
	if err != nil || !slices.Equal(ids[0], m.EncodeText(text, false)) {
		t.Errorf("LocalTokens: %v (err %v)", ids, err)
	}
}

// TestHarmonySchema: JSON schema shapes beyond the goldens, as json_schema_to_typescript
// writes them (nested objects indented by four spaces, title/examples comments,
// nullable, integer and bool defaults, type lists).
func TestHarmonySchema(t *testing.T) {
	v, err := request.Parse(request.APIChat, []byte(`{"model":"m","messages":[{"role":"user","content":"u"}],"tools":[{"type":"function","function":{"name":"f","description":"d","parameters":
		{"type":"object","description":"params","properties":{
		  "s":{"type":"string","title":"S","description":"A string","examples":["hello","world"]},
		  "n":{"type":"string","nullable":true,"default":"the default"},
		  "i":{"type":"integer","default":10},
		  "b":{"type":"boolean","default":false},
		  "u":{"type":["number","string"]},
		  "a":{"type":"array"},
		  "o":{"type":"object","properties":{"x":{"type":"number"}},"required":["x"]}}}}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	got, err := schemaTS(v.Tools[0].Field("function").Field("parameters"), "")
	if err != nil {
		t.Fatal(err)
	}
	want := "// params\n{\n// S\n//\n// A string\n// Examples:\n// - \"hello\"\n// - \"world\"\ns?: string,\n" +
		"n?: string | null, // default: \"the default\"\ni?: number, // default: 10\nb?: boolean, // default: false\n" +
		"u?: number | string,\na?: Array<any>,\no?: {\n    x: number,\n    },\n}"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestHarmonyService: gpt-oss chat requests take the local path through harmony; a
// refused construct (a system message) goes on to the remote path; the shadow check
// leaves harmony chat alone (vLLM's /tokenize renders messages with the HF template)
// and still checks completions.
func TestHarmonyService(t *testing.T) {
	m := harmonyModel(t, HarmonyOptions{StartDate: "2025-06-28"})
	w := newFakeWorker(t)
	ms := metrics.NewUnregistered().Tokenize
	s, err := NewService(ServiceOptions{Models: []ModelConfig{{Name: "gptoss", Model: m, Paths: []Path{PathLocal, PathRemote}}},
		Metrics: ms, Address: func(string) (string, bool) { return w.addr(), true },
		Shadow: ShadowOptions{Fraction: 1, MaxPerSecond: 1000, Concurrency: 10}})
	if err != nil {
		t.Fatal(err)
	}
	req := hchat(t, `{"model":"gptoss","messages":[{"role":"user","content":"What is 2 + 2?"}]}`)
	res, err := s.Tokenize(context.Background(), req)
	if err != nil || res.Path != PathLocal {
		t.Fatalf("plain chat: %+v, %v; want the local path", res, err)
	}
	want, _, _ := m.RenderHarmony(req)
	if !slices.Equal(res.Tokens, want) {
		t.Fatalf("local ids are not the harmony rendering")
	}
	s.Shadow(req, PathLocal, res.Tokens, w.addr())
	s.WaitShadow()
	if n := w.calls.Load(); n != 0 {
		t.Fatalf("shadow check called /tokenize %d times for a harmony chat", n)
	}
	sys := hchat(t, `{"model":"gptoss","messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}]}`)
	if res, err := s.Tokenize(context.Background(), sys); err != nil || res.Path != PathRemote {
		t.Fatalf("system message: %+v, %v; want the remote path", res, err)
	}
	cmp, err := request.Parse(request.APICompletions, []byte(`{"model":"gptoss","prompt":"hello"}`))
	if err != nil {
		t.Fatal(err)
	}
	before := w.calls.Load()
	s.Shadow(cmp, PathLocal, []uint32{1, 2, 3, 4}, w.addr())
	s.WaitShadow()
	if w.calls.Load() != before+1 {
		t.Fatal("completions are still shadow-checked")
	}
}

// BenchmarkHarmony: a gpt-oss chat with the three tools of format.md, a tool call
// and its result, rendered to ids.
func BenchmarkHarmony(b *testing.B) {
	base := loadFamily(b, "gptoss")
	req, err := request.Parse(request.APIChat, []byte(`{"model":"m","reasoning_effort":"high","tools":`+formatMDTools+`,"messages":[
		{"role":"user","content":"What is the weather like in SF?"},
		{"role":"assistant","reasoning":"Need to use function get_weather.","tool_calls":[{"id":"c","type":"function","function":{"name":"get_weather","arguments":"{\"location\":\"San Francisco\"}"}}]},
		{"role":"tool","tool_call_id":"c","content":"{\"sunny\": true, \"temperature\": 20}"}]}`))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for range b.N {
		if _, _, err := base.RenderHarmony(req); err != nil {
			b.Fatal(err)
		}
	}
}
