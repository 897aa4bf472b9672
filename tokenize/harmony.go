package tokenize

import (
	"fmt"
	"strings"
	"time"

	"github.com/kvroute/kvroute/request"
)

// Harmony rendering of gpt-oss chat requests.
//
// vLLM does not render gpt-oss chat with a Jinja template: it builds openai_harmony
// messages and renders them to token ids (vllm/entrypoints/openai/parser/harmony_utils.py
// at vllm-project/vllm 0142105b, _make_request_with_harmony in the chat serving code):
//
//   - a system message: SystemContent.new() (identity "You are ChatGPT, a large
//     language model trained by OpenAI.", knowledge cutoff 2024-06, reasoning medium
//     unless reasoning_effort says low/high, channels analysis, commentary, final
//     required) with the conversation start date datetime.now().strftime("%Y-%m-%d")
//     on the engine host;
//   - when the request has tools, a developer message with them in the "functions"
//     namespace (TypeScript-like types from the JSON schemas);
//   - the chat messages: user text; assistant reasoning → analysis channel, content →
//     final channel (commentary when it comes with tool calls), each tool call →
//     commentary to=functions.NAME with content type json and <|call|>; tool results →
//     author functions.NAME (found by tool_call_id) to=assistant on commentary;
//   - analysis dropped as vLLM's auto_drop_analysis_messages and harmony's
//     render_conversation (auto_drop_analysis) do;
//   - then <|start|>assistant.
//
// Text pieces are encoded one by one with no special-token matching (tiktoken's
// encode_ordinary), as harmony's renderer does; the formatting tokens are the ids
// of <|start|>, <|message|>, ….
//
// What the references disagree on, or what was not checked against a reference
// rendering, is refused with ErrContent so that the request takes the next path (the
// worker's /tokenize): system and developer role messages (vLLM versions render them
// as a second system message or as developer instructions), Anthropic /v1/messages
// requests, non-function tools, tools without a description, schemas with oneOf,
// non-integer numeric or array/object defaults, non-text content parts, non-string
// tool-call arguments, reasoning_content without reasoning, and reasoning_effort
// other than low, medium or high.

// harmonyIDs are the ids of harmony's formatting tokens in the model's vocabulary.
type harmonyIDs struct {
	start, end, message, channel, constrain, call uint32
}

// harmonyFor returns the formatting token ids when the model's added tokens are
// harmony's (o200k_harmony: gpt-oss), else nil.
func harmonyFor(m *Model) *harmonyIDs {
	var h harmonyIDs
	for _, t := range []struct {
		s  string
		id *uint32
	}{{"<|start|>", &h.start}, {"<|end|>", &h.end}, {"<|message|>", &h.message}, {"<|channel|>", &h.channel},
		{"<|constrain|>", &h.constrain}, {"<|call|>", &h.call}} {
		id, ok := m.SpecialID(t.s)
		if !ok {
			return nil
		}
		*t.id = id
	}
	if _, ok := m.SpecialID("<|return|>"); !ok {
		return nil
	}
	return &h
}

// HarmonyOptions set the one input of the harmony system message that is not in the
// request: the conversation start date vLLM takes from the engine host's clock.
type HarmonyOptions struct {
	// Location is the engine hosts' time zone (datetime.now() is local time there);
	// nil means UTC.
	Location *time.Location
	// StartDate, when set, is used as is (vLLM's VLLM_SYSTEM_START_DATE pins it).
	StartDate string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (o HarmonyOptions) date() string {
	if o.StartDate != "" {
		return o.StartDate
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	loc := o.Location
	if loc == nil {
		loc = time.UTC
	}
	return now().In(loc).Format("2006-01-02")
}

// hmsg is one harmony message.
type hmsg struct {
	role        string // user, assistant, system, developer, tool
	name        string // the author name (tools: functions.NAME)
	recipient   string
	channel     string
	contentType string
	texts       []string // text contents, rendered one after the other
}

// errHarmony wraps ErrContent: a construct the harmony renderer does not compute.
func errHarmony(format string, a ...any) error {
	return fmt.Errorf("%w: harmony: %s", ErrContent, fmt.Sprintf(format, a...))
}

// IsHarmony reports whether chat requests for m are rendered with harmony.
func (m *Model) IsHarmony() bool { return m.harmony != nil }

// RenderHarmony returns the token ids vLLM computes for a gpt-oss chat request, and
// the same prompt as text (formatting tokens spelled out), or ErrContent for what it
// refuses (see the list above). It fails with ErrNoTemplate when m is not a harmony
// model.
func (m *Model) RenderHarmony(req *request.Request) ([]uint32, string, error) {
	if m.harmony == nil {
		return nil, "", fmt.Errorf("%w: not a harmony model", ErrNoTemplate)
	}
	msgs, err := m.harmonyMessages(req)
	if err != nil {
		return nil, "", err
	}
	r := harmonyRender{m: m, h: m.harmony}
	for _, msg := range msgs {
		r.message(msg)
	}
	r.special(m.harmony.start, "<|start|>")
	r.text("assistant")
	return r.ids, r.sb.String(), nil
}

// harmonyMessages builds the conversation as vLLM does for a chat request.
func (m *Model) harmonyMessages(req *request.Request) ([]hmsg, error) {
	if req.API != request.APIChat {
		return nil, errHarmony("API %q", req.API)
	}
	effort := "medium"
	switch req.ReasoningEffort {
	case "":
	case "low", "medium", "high":
		effort = req.ReasoningEffort
	default:
		return nil, errHarmony("reasoning_effort %q", req.ReasoningEffort)
	}
	sys := "You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: " +
		m.harmonyOpts.date() + "\n\nReasoning: " + effort +
		"\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message."
	if len(req.Tools) > 0 {
		sys += "\nCalls to these tools must go to the commentary channel: 'functions'."
	}
	out := []hmsg{{role: "system", texts: []string{sys}}}
	if len(req.Tools) > 0 {
		dev, err := harmonyTools(req.Tools)
		if err != nil {
			return nil, err
		}
		out = append(out, hmsg{role: "developer", texts: []string{dev}})
	}
	// Tool call id → function name, over every message (tool results name their call).
	names := map[string]string{}
	for _, msg := range req.Messages {
		tcs := msg.Field("tool_calls")
		for j := range tcs.Len() {
			tc := tcs.Index(j)
			id, _ := tc.Field("id").Str()
			name, _ := tc.Field("function").Field("name").Str()
			names[id] = name
		}
	}
	var conv []hmsg
	for i, msg := range req.Messages {
		ms, err := harmonyMessage(msg, names)
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		conv = append(conv, ms...)
	}
	conv = dropTurnAnalysis(conv)
	out = append(out, conv...)
	return dropAnalysisBeforeFinal(out), nil
}

// harmonyMessage converts one chat message (parse_chat_input_to_harmony_message).
func harmonyMessage(msg request.Value, names map[string]string) ([]hmsg, error) {
	role, _ := msg.Field("role").Str()
	switch role {
	case "user", "assistant", "tool":
	default:
		return nil, errHarmony("role %q", role)
	}
	if _, ok := msg.Get("reasoning_content"); ok {
		if _, ok := msg.Get("reasoning"); !ok {
			return nil, errHarmony("reasoning_content without reasoning")
		}
	}
	reasoning := ""
	if r := msg.Field("reasoning"); r.Kind() != request.Null {
		s, ok := r.Str()
		if !ok {
			return nil, errHarmony("reasoning of type %s", r.Kind())
		}
		reasoning = s
	}
	parts, err := harmonyTexts(msg.Field("content"))
	if err != nil {
		return nil, err
	}
	tcs := msg.Field("tool_calls")
	if role == "assistant" && tcs.Kind() == request.Array && tcs.Len() > 0 {
		var out []hmsg
		if c := strings.Join(parts, ""); c != "" {
			out = append(out, hmsg{role: "assistant", channel: "commentary", texts: []string{c}})
		}
		if reasoning != "" {
			out = append(out, hmsg{role: "assistant", channel: "analysis", texts: []string{reasoning}})
		}
		for j := range tcs.Len() {
			fn := tcs.Index(j).Field("function")
			name, _ := fn.Field("name").Str()
			args := ""
			switch a := fn.Field("arguments"); a.Kind() {
			case request.Null:
			case request.String:
				args = a.Text()
			default:
				return nil, errHarmony("tool call arguments of type %s", a.Kind())
			}
			out = append(out, hmsg{role: "assistant", channel: "commentary", recipient: "functions." + name,
				contentType: "json", texts: []string{args}})
		}
		return out, nil
	}
	if role == "tool" {
		id, _ := msg.Field("tool_call_id").Str()
		return []hmsg{{role: "tool", name: "functions." + names[id], channel: "commentary", recipient: "assistant",
			texts: []string{strings.Join(parts, "")}}}, nil
	}
	var out []hmsg
	if role == "assistant" && reasoning != "" {
		out = append(out, hmsg{role: "assistant", channel: "analysis", texts: []string{reasoning}})
	}
	if role == "assistant" {
		if len(parts) > 0 && parts[0] != "" {
			out = append(out, hmsg{role: "assistant", channel: "final", texts: parts})
		}
		return out, nil
	}
	return append(out, hmsg{role: role, texts: parts}), nil
}

// harmonyTexts returns a message content's texts: a string is one text, a list gives
// one text per text part (vLLM keeps them as separate TextContents), null none.
func harmonyTexts(c request.Value) ([]string, error) {
	switch c.Kind() {
	case request.Null:
		return nil, nil
	case request.String:
		return []string{c.Text()}, nil
	case request.Array:
		out := make([]string, 0, c.Len())
		for i := range c.Len() {
			p := c.Index(i)
			if typ, _ := p.Field("type").Str(); typ != "text" {
				return nil, errHarmony("content part type %q", typ)
			}
			s, ok := p.Field("text").Str()
			if !ok {
				return nil, errHarmony("text part without a string text")
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, errHarmony("content of type %s", c.Kind())
}

// dropTurnAnalysis is vLLM's auto_drop_analysis_messages: in the current turn (after
// the last user message), analysis messages before the turn's last final message go.
func dropTurnAnalysis(msgs []hmsg) []hmsg {
	start := 0
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].role == "user" {
			start = i + 1
			break
		}
	}
	last := -1
	for i := len(msgs) - 1; i >= start; i-- {
		if msgs[i].role == "assistant" && msgs[i].channel == "final" {
			last = i
			break
		}
	}
	if last < start {
		return msgs
	}
	out := msgs[:0:0]
	for i, msg := range msgs {
		if start <= i && i < last && msg.channel == "analysis" && msg.role != "user" {
			continue
		}
		out = append(out, msg)
	}
	return out
}

// dropAnalysisBeforeFinal is harmony's render_conversation with auto_drop_analysis
// (the Python binding's default): when the last assistant message is on the final
// channel, analysis messages before the first final message are dropped.
func dropAnalysisBeforeFinal(msgs []hmsg) []hmsg {
	lastFinal := false
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].role == "assistant" {
			lastFinal = msgs[i].channel == "final"
			break
		}
	}
	if !lastFinal {
		return msgs
	}
	first := -1
	for i, msg := range msgs {
		if msg.channel == "final" {
			first = i
			break
		}
	}
	out := msgs[:0:0]
	for i, msg := range msgs {
		if first >= 0 && i < first && msg.channel == "analysis" {
			continue
		}
		out = append(out, msg)
	}
	return out
}

// harmonyRender accumulates ids and the text form of a rendering.
type harmonyRender struct {
	m   *Model
	h   *harmonyIDs
	ids []uint32
	sb  strings.Builder
}

func (r *harmonyRender) special(id uint32, s string) {
	r.ids = append(r.ids, id)
	r.sb.WriteString(s)
}

// text encodes s on its own with no special-token matching (encode_ordinary).
func (r *harmonyRender) text(s string) {
	if s == "" {
		return
	}
	r.ids = r.m.appendSegment(r.ids, s)
	r.sb.WriteString(s)
}

// message renders one message as harmony's Render<Message>: <|start|>, the role (a
// tool's name instead), " to=RECIPIENT", <|channel|>CHANNEL, " CONTENT_TYPE",
// <|message|>, the contents, then <|call|> for an assistant message with a recipient,
// else <|end|>.
func (r *harmonyRender) message(msg hmsg) {
	r.special(r.h.start, "<|start|>")
	if msg.role == "tool" {
		r.text(msg.name)
	} else {
		r.text(msg.role)
		if msg.name != "" {
			r.text(":" + msg.name)
		}
	}
	if msg.recipient != "" && msg.recipient != "all" {
		r.text(" to=" + msg.recipient)
	}
	if msg.channel != "" {
		r.special(r.h.channel, "<|channel|>")
		r.text(msg.channel)
	}
	if msg.contentType != "" {
		if rest, ok := strings.CutPrefix(msg.contentType, "<|constrain|>"); ok {
			r.text(" ")
			r.special(r.h.constrain, "<|constrain|>")
			r.text(rest)
		} else {
			r.text(" " + msg.contentType)
		}
	}
	r.special(r.h.message, "<|message|>")
	for _, t := range msg.texts {
		r.text(t)
	}
	if msg.role == "assistant" && msg.recipient != "" {
		r.special(r.h.call, "<|call|>")
	} else {
		r.special(r.h.end, "<|end|>")
	}
}
