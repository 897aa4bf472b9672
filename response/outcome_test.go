package response

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// outcomeCases are whole response bodies with the outcome their status and body give.
// Shared by the table test, the every-split test and the fuzz seeds.
var outcomeCases = []struct {
	name      string
	status    int
	stream    bool
	inference bool
	body      string
	want      Outcome
	ended     bool // Ended() after the whole body
	first     bool // a first token was seen
}{
	{"chat stream ok", 200, true, true, chatSSEFinished, OutcomeOK, true, true},
	{"only [DONE]", 200, true, true, "data: [DONE]\n\n", OutcomeTruncated, true, false},
	{"role then [DONE]", 200, true, true, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}\n\ndata: [DONE]\n\n", OutcomeTruncated, true, false},
	{"no finish, no [DONE]", 200, true, true, "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n", OutcomeTruncated, false, true},
	{"finish without [DONE]", 200, true, true, "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"length\"}]}\n\n", OutcomeOK, false, true},
	{"vllm error event mid-stream", 200, true, true,
		"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n" +
			"data: {\"error\":{\"object\":\"error\",\"message\":\"engine dead\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\n" +
			"data: [DONE]\n\n", OutcomeErrorEvent, true, true},
	{"anthropic error event", 200, true, true,
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3}}}\n\n" +
			"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n", OutcomeErrorEvent, false, false},
	{"finish_reason error", 200, true, true, "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"error\"}]}\n\ndata: [DONE]\n\n", OutcomeErrorEvent, true, false},
	{"finish_reason abort", 200, true, true, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"finish_reason\":\"abort\"}]}\n\ndata: [DONE]\n\n", OutcomeAborted, true, true},
	{"content says error", 200, true, true, "data: {\"choices\":[{\"delta\":{\"content\":\"error\"},\"finish_reason\":\"stop\"}],\"error\":null}\n\ndata: [DONE]\n\n", OutcomeOK, true, true},
	{"anthropic stream ok", 200, true, true, anthropicSSE, OutcomeOK, true, true},
	{"anthropic stream cut", 200, true, true, anthropicSSE[:bytes.Index([]byte(anthropicSSE), []byte("event: message_delta"))], OutcomeTruncated, false, true},
	{"json ok", 200, false, true, `{"choices":[{"message":{"content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":2}}`, OutcomeOK, false, false},
	{"json no finish", 200, false, true, `{"choices":[{"message":{"content":"hello"},"finish_reason":null}]}`, OutcomeTruncated, false, false},
	{"json error body 200", 200, false, true, `{"error":{"message":"bad","type":"BadRequestError","code":400}}`, OutcomeErrorEvent, false, false},
	{"json old vllm error 200", 200, false, true, `{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}`, OutcomeErrorEvent, false, false},
	{"json anthropic ok", 200, false, true, `{"type":"message","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":3}}`, OutcomeOK, false, false},
	{"json anthropic error", 200, false, true, `{"type":"error","error":{"type":"api_error","message":"x"}}`, OutcomeErrorEvent, false, false},
	{"json not json", 200, false, true, `<html>`, OutcomeTruncated, false, false},
	{"400", 400, false, true, `{"error":{"message":"bad","type":"BadRequestError","code":400}}`, OutcomeClientError, false, false},
	{"404 stream", 404, true, true, `{"error":{"message":"no","code":404}}`, OutcomeClientError, false, false},
	{"500", 500, false, true, `{"error":{"message":"boom","code":500}}`, OutcomeUpstreamError, false, false},
	{"503 sse", 503, true, true, chatSSEFinished, OutcomeUpstreamError, true, true},
	{"other path 200", 200, false, false, `{"object":"list","data":[]}`, OutcomeOK, false, false},
	{"other path 422", 422, false, false, `{}`, OutcomeClientError, false, false},
}

const chatSSEFinished = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n" +
	"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}],\"usage\":null}\n\n" +
	"data: {\"choices\":[{\"delta\":{\"content\":\" there\"},\"finish_reason\" : \"stop\"}]}\n\n" +
	"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n" +
	"data: [DONE]\n\n"

const anthropicSSE = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":9,\"output_tokens\":0}}}\n\n" +
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n" +
	"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\n" +
	"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"

func TestOutcomes(t *testing.T) {
	for _, c := range outcomeCases {
		tr := NewTracker(c.stream, 0)
		tr.Write([]byte(c.body))
		if tr.Ended() != c.ended {
			t.Errorf("%s: Ended() = %v, want %v", c.name, tr.Ended(), c.ended)
		}
		r := tr.Result(c.status, c.inference)
		if r.Outcome != c.want || r.Status != c.status || tr.FirstTokenSeen() != c.first {
			t.Errorf("%s: outcome %q first token %v, want %q and %v", c.name, r.Outcome, tr.FirstTokenSeen(), c.want, c.first)
		}
	}
}

// Every split of every case gives the same outcome, usage, first token and end marker
// as the whole body in one chunk (Envoy cuts body chunks anywhere, envoy#45437).
func TestOutcomesEverySplit(t *testing.T) {
	for _, c := range outcomeCases {
		want := track(c.stream, 0, [][]byte{[]byte(c.body)}, c.status, c.inference)
		for split := 0; split <= len(c.body); split++ {
			got := track(c.stream, 0, [][]byte{[]byte(c.body[:split]), []byte(c.body[split:])}, c.status, c.inference)
			if got != want {
				t.Fatalf("%s, split %d: %+v, want %+v", c.name, split, got, want)
			}
		}
	}
}

// A vLLM stream without --enable-prompt-tokens-details: no cached-token report, which
// is not a report of 0; an explicit 0 is one.
func TestCachedTokensReportKinds(t *testing.T) {
	for body, want := range map[string]struct {
		kind   string
		cached int
	}{
		`{"usage":{"prompt_tokens":5}}`:                                                {"absent", 0},
		`{"usage":{"prompt_tokens":5,"prompt_tokens_details":null}}`:                   {"absent", 0},
		`{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":null}}}`: {"absent", 0},
		`{"usage":{"prompt_tokens":5,"prompt_tokens_details":{}}}`:                     {"absent", 0},
		`{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":0}}}`:    {"reported", 0},
		`{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":3}}}`:    {"reported", 3},
		`{"usage":{"input_tokens":5,"cache_read_input_tokens":0}}`:                     {"reported", 0},
		`{"usage":null}`: {"no_usage", 0},
		`{"id":"x"}`:     {"no_usage", 0},
	} {
		tr := NewTracker(false, 0)
		tr.Write([]byte(body))
		u := tr.Finish()
		if u.CachedReport() != want.kind || u.CachedTokens != want.cached || u.CachedReported != (want.kind == "reported") {
			t.Errorf("%s: %+v kind %q, want %q with %d", body, u, u.CachedReport(), want.kind, want.cached)
		}
	}
	// Anthropic: message_start reports the cache read; message_delta's later usage
	// without the field does not take the report back.
	tr := NewTracker(true, 0)
	tr.Write([]byte("data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"cache_read_input_tokens\":0}}}\n\n" +
		"data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n\n"))
	if u := tr.Finish(); !u.CachedReported || u.CachedTokens != 0 || u.CompletionTokens != 7 {
		t.Fatalf("%+v", u)
	}
}

type tracked struct {
	Result
	First, Ended bool
}

func track(stream bool, maxBody int, chunks [][]byte, status int, inference bool) tracked {
	tr := NewTracker(stream, maxBody)
	firsts := 0
	for _, c := range chunks {
		if tr.Write(c) {
			firsts++
		}
	}
	ended := tr.Ended()
	r := tr.Result(status, inference)
	if firsts > 1 {
		panic("first token reported more than once")
	}
	return tracked{Result: r, First: tr.FirstTokenSeen(), Ended: ended}
}

// FuzzTracker feeds random bodies in random chunkings: no panic, the first token at
// most once, and the same result (outcome, usage, first token, end marker) for every
// chunking of the same bytes. Seeds: every outcome case.
func FuzzTracker(f *testing.F) {
	for _, c := range outcomeCases {
		f.Add([]byte(c.body), uint64(len(c.body)), c.stream, uint16(0))
	}
	f.Add([]byte(chatSSE), uint64(7), true, uint16(40))
	f.Add([]byte("data: {\"choices\":[{\"text\":\"\\u00e9\"}]}\r\ndata: [DONE]\r\n"), uint64(3), true, uint16(16))
	f.Fuzz(func(t *testing.T, body []byte, seed uint64, stream bool, maxBody uint16) {
		mb := int(maxBody)
		whole := track(stream, mb, [][]byte{body}, 200, true)
		rng := rand.New(rand.NewPCG(seed, seed>>7))
		var chunks [][]byte
		for rest := body; len(rest) > 0; {
			n := 1 + rng.IntN(len(rest))
			if rng.IntN(4) == 0 {
				chunks = append(chunks, nil) // empty chunks happen (envoy#44101)
			}
			chunks = append(chunks, rest[:n])
			rest = rest[n:]
		}
		if got := track(stream, mb, chunks, 200, true); got != whole {
			t.Fatalf("chunked %d ways: %+v, whole: %+v", len(chunks), got, whole)
		}
		for _, st := range []int{0, 204, 400, 503} {
			_ = track(stream, mb, chunks, st, rng.IntN(2) == 0)
		}
	})
}

func TestStreamBody(t *testing.T) {
	for _, c := range []struct {
		ct        string
		requested bool
		want      bool
	}{
		{"text/event-stream", false, true},
		{"text/event-stream; charset=utf-8", false, true},
		{"application/json", true, false},
		{"", true, true},
		{"", false, false},
		{"text/plain", true, true},
	} {
		if got := StreamBody(c.ct, c.requested); got != c.want {
			t.Errorf("StreamBody(%q, %v) = %v", c.ct, c.requested, got)
		}
	}
}
