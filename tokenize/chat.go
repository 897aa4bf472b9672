package tokenize

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/kvroute/kvroute/internal/jsonvalue"
	"github.com/kvroute/kvroute/request"
)

// chatTemplate is a compiled chat template. Rendering follows transformers'
// apply_chat_template environment (trim_blocks, lstrip_blocks, loopcontrols, tojson
// with ensure_ascii=False and Python separators, raise_exception, strftime_now), all
// of which github.com/ardanlabs/jinja implements as its defaults.
type chatTemplate struct {
	tmpl *jinja.Template
	src  string
	// openai is vLLM's detected content format: true when the template iterates over a
	// message's content (parts are passed as a list), false for "string".
	openai bool
	// lits are the strings the template tests message text against (window.go).
	lits []string
	// clock is what the template reads of the current time (strftime_now): clockNone,
	// clockDate (a render holds for the day) or clockTime (renders are never cached).
	clock uint8
}

const (
	clockNone uint8 = iota
	clockDate
	clockTime
)

// timeCodes are the strftime codes finer than a day.
var timeCodes = regexp.MustCompile(`%[-#]?[HIMSpXcfsTrRzZ]`)

// templateClock classifies src's use of strftime_now (its formats are in the source
// or in variables; any time-of-day code anywhere counts).
func templateClock(src string) uint8 {
	switch {
	case !strings.Contains(src, "strftime_now"):
		return clockNone
	case timeCodes.MatchString(src):
		return clockTime
	}
	return clockDate
}

// contentLoop finds `for x in message['content']` / `message.content` style loops,
// which is what vLLM's _detect_content_format looks for in the template AST
// (vllm/entrypoints/chat_utils.py).
var contentLoop = regexp.MustCompile(`\{%-?\s*for\s+\w+\s+in\s+\w+(?:\[\s*['"]content['"]\s*\]|\.content)\s*(?:\||-?%\})`)

func compileChatTemplate(src string) (*chatTemplate, error) {
	t, err := jinja.Compile(routeTojson(src))
	if err != nil {
		return nil, fmt.Errorf("%w: does not compile: %v", ErrTemplate, err)
	}
	ct := &chatTemplate{tmpl: t, src: src, openai: contentLoop.MatchString(src), lits: templateLiterals(src), clock: templateClock(src)}
	// Render a small conversation once so that a template using something the engine
	// lacks (an unknown filter or method) is reported at load time, not per request.
	probe := jsonvalue.ValueOf([]any{map[string]any{"role": "system", "content": "s"}, map[string]any{"role": "user", "content": "u"},
		map[string]any{"role": "assistant", "content": "a"}, map[string]any{"role": "user", "content": "u"}})
	vars := map[string]jinja.Value{"messages": toJinja(probe), "add_generation_prompt": jinja.NewBool(true), tojsonFilter: tojsonValue}
	if _, err := t.RenderValues(vars); err != nil && !strings.Contains(err.Error(), "raise_exception") {
		return nil, fmt.Errorf("%w: cannot render a plain conversation: %v", ErrTemplate, err)
	}
	return ct, nil
}

// RenderChat renders a chat or Anthropic messages request with the model's chat
// template as vLLM does before tokenizing (vLLM vllm/entrypoints/chat_utils.py):
// messages normalized (reasoning_content → reasoning, tool_calls arguments parsed,
// content as string or OpenAI parts per the template), tools normalized, template
// variables add_generation_prompt (default true), continue_final_message, the special
// tokens, chat_template_kwargs, and reasoning_effort → enable_thinking.
// The result is tokenized with EncodeText(text, false).
func (m *Model) RenderChat(req *request.Request) (string, error) {
	if m.harmony != nil {
		_, text, err := m.RenderHarmony(req)
		return text, err
	}
	c, err := m.prepareChat(req)
	if err != nil {
		return "", err
	}
	conv, err := normalizeMessages(c.msgs, m.chat.openai)
	if err != nil {
		return "", err
	}
	return m.renderFull(c, conv)
}

// renderFull renders the whole conversation conv (c.msgs normalized) and applies
// continue_final_message's cut.
func (m *Model) renderFull(c *chatCall, conv jinja.Value) (string, error) {
	out, err := m.renderList(c.vars, conv, c.agp, c.cfm, c.flagKwargs)
	if err != nil {
		return "", err
	}
	if c.cfm {
		if out, err = trimAfterFinal(out, conv); err != nil {
			return "", err
		}
	}
	return out, nil
}

// renderList renders the template over messages with the given generation flags.
// vars is the request's other template inputs (chatCall.vars); it is modified.
func (m *Model) renderList(vars map[string]jinja.Value, messages jinja.Value, agp, cfm bool, flagKwargs map[string]jinja.Value) (string, error) {
	vars["messages"] = messages
	vars["add_generation_prompt"] = jinja.NewBool(agp)
	vars["continue_final_message"] = jinja.NewBool(cfm)
	for k, v := range flagKwargs {
		vars[k] = v
	}
	out, err := m.chat.tmpl.RenderValues(vars)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrTemplate, err)
	}
	return out, nil
}

// chatCall is a chat request's template inputs: its messages in chat form (Anthropic
// converted), the generation flags, and every other variable.
type chatCall struct {
	msgs     []jsonvalue.Value
	vars     map[string]jinja.Value // without messages, add_generation_prompt, continue_final_message
	agp, cfm bool
	// flagKwargs are chat_template_kwargs named add_generation_prompt or
	// continue_final_message, which override the flags' variables (never incremental).
	flagKwargs map[string]jinja.Value
}

// prepareChat builds the template inputs of req (vLLM vllm/entrypoints/chat_utils.py):
// the special tokens, tools, add_generation_prompt (default true),
// continue_final_message, reasoning_effort → enable_thinking, chat_template_kwargs.
func (m *Model) prepareChat(req *request.Request) (*chatCall, error) {
	if m.chat == nil {
		return nil, m.chatErr
	}
	c := &chatCall{msgs: req.Messages}
	if req.API == request.APIMessages {
		var err error
		if c.msgs, err = anthropicToChat(req.System, req.Messages); err != nil {
			return nil, err
		}
	}
	vars := map[string]jinja.Value{tojsonFilter: tojsonValue}
	for k, v := range m.specials {
		vars[k] = jinja.NewString(v)
	}
	if len(m.additional) > 0 {
		l := make([]jinja.Value, len(m.additional))
		for i, s := range m.additional {
			l[i] = jinja.NewString(s)
		}
		vars["additional_special_tokens"] = jinja.NewList(l)
	}
	tools, err := normalizeTools(req)
	if err != nil {
		return nil, err
	}
	vars["tools"] = tools
	vars["documents"] = jinja.None()
	c.agp = true
	if req.AddGenerationPrompt != nil {
		c.agp = *req.AddGenerationPrompt
	}
	c.cfm = req.ContinueFinalMessage
	if c.agp && c.cfm {
		return nil, fmt.Errorf("%w: add_generation_prompt and continue_final_message are both set", ErrTemplate)
	}
	if req.ReasoningEffort != "" {
		vars["reasoning_effort"] = jinja.NewString(req.ReasoningEffort)
		if _, given := req.Kwarg("enable_thinking"); !given {
			vars["enable_thinking"] = jinja.NewBool(req.ReasoningEffort != "none")
		}
	}
	for _, kw := range req.ChatTemplateKwargs {
		switch kw.Key {
		case "messages", tojsonFilter:
			continue
		case "add_generation_prompt", "continue_final_message":
			// A kwarg overrides the request's flag in the template's variables.
			if c.flagKwargs == nil {
				c.flagKwargs = map[string]jinja.Value{}
			}
			c.flagKwargs[kw.Key] = toJinja(kw.Value)
			continue
		}
		vars[kw.Key] = toJinja(kw.Value)
	}
	c.vars = vars
	return c, nil
}

// trimAfterFinal cuts the render after the final message's stripped text
// (transformers apply_chat_template, continue_final_message).
func trimAfterFinal(out string, conv jinja.Value) (string, error) {
	items := conv.AsList().Items
	if len(items) == 0 {
		return out, nil
	}
	c := get(items[len(items)-1], "content")
	final := ""
	switch {
	case c.IsString():
		final = c.AsString()
	case c.IsList():
		found := false
		for i := len(c.AsList().Items) - 1; i >= 0 && !found; i-- {
			if t := get(c.AsList().Items[i], "text"); t.IsString() {
				final, found = t.AsString(), true
			}
		}
		if !found {
			return "", fmt.Errorf("%w: continue_final_message: the final message has no text", ErrTemplate)
		}
	}
	final = strings.TrimSpace(final)
	i := strings.LastIndex(out, final)
	if i < 0 {
		return "", fmt.Errorf("%w: continue_final_message: the final message is not in the render", ErrTemplate)
	}
	return out[:i+len(final)], nil
}

// ErrContent: a message part kvroute cannot render (images, audio: their placeholder
// tokens depend on the model's processor). The worker's /tokenize path handles them.
var ErrContent = errors.New("tokenize: unsupported message content")

// normalizeMessages builds the conversation vLLM passes to the template
// (vllm/entrypoints/chat_utils.py _parse_chat_message_content and
// _postprocess_messages), keys in vLLM's order: role, content, tool_calls (assistant,
// non-empty), reasoning and reasoning_content (assistant), tool_call_id (tool), name
// and task (strings).
func normalizeMessages(msgs []jsonvalue.Value, openai bool) (jinja.Value, error) {
	out := make([]jinja.Value, 0, len(msgs))
	for i, msg := range msgs {
		d, err := normalizeMessage(msg, openai)
		if err != nil {
			return jinja.Undefined(), fmt.Errorf("messages[%d]: %w", i, err)
		}
		out = append(out, d)
	}
	return jinja.NewList(out), nil
}

// normalizeMessage is normalizeMessages for one message.
func normalizeMessage(msg jsonvalue.Value, openai bool) (jinja.Value, error) {
	role, _ := msg.Field("role").Str()
	d := jinja.NewDict()
	dict := d.AsDict()
	dict.Set("role", jinja.NewString(role))
	content, err := normalizeContent(msg.Field("content"), openai)
	if err != nil {
		return jinja.Undefined(), err
	}
	if role == "tool" && content.IsList() {
		// Tool results given as text parts reach the template as one string.
		var texts []string
		for _, p := range content.AsList().Items {
			texts = append(texts, get(p, "text").AsString())
		}
		content = jinja.NewString(strings.Join(texts, "\n"))
	}
	dict.Set("content", content)
	if role == "assistant" {
		if tcs := msg.Field("tool_calls"); tcs.Kind() == jsonvalue.Array && tcs.Len() > 0 {
			calls := make([]jinja.Value, 0, tcs.Len())
			for j := range tcs.Len() {
				calls = append(calls, normalizeToolCall(tcs.Index(j)))
			}
			dict.Set("tool_calls", jinja.NewList(calls))
		}
		r, ok := msg.Get("reasoning")
		if !ok {
			r, ok = msg.Get("reasoning_content")
		}
		if ok && !r.IsNull() {
			dict.Set("reasoning", toJinja(r))
			dict.Set("reasoning_content", toJinja(r))
		}
	}
	if id, ok := msg.Get("tool_call_id"); ok && role == "tool" {
		dict.Set("tool_call_id", toJinja(id))
	}
	for _, k := range []string{"name", "task"} {
		if v, ok := msg.Field(k).Str(); ok {
			dict.Set(k, jinja.NewString(v))
		}
	}
	return d, nil
}

// normalizeContent applies vLLM's content format: "string" joins text parts with "\n"
// (empty parts dropped, null → ""); "openai" passes a list of text parts (null → []).
func normalizeContent(c jsonvalue.Value, openai bool) (jinja.Value, error) {
	var parts []string
	switch c.Kind() {
	case jsonvalue.Null:
	case jsonvalue.String:
		if !openai {
			return jinja.NewString(c.Text()), nil
		}
		parts = []string{c.Text()}
	case jsonvalue.Array:
		for i := range c.Len() {
			p := c.Index(i)
			if p.Kind() != jsonvalue.Object {
				if s, ok := p.Str(); ok {
					parts = append(parts, s)
					continue
				}
				return jinja.Undefined(), fmt.Errorf("%w: content part of type %s", ErrContent, p.Kind())
			}
			typ, _ := p.Field("type").Str()
			key := "text"
			switch typ {
			case "refusal", "thinking":
				key = typ
				fallthrough
			case "text", "input_text", "output_text":
				s, ok := p.Field(key).Str()
				if !ok {
					continue // a part without its text is skipped, as vLLM does
				}
				parts = append(parts, s)
			default:
				return jinja.Undefined(), fmt.Errorf("%w: content part type %q", ErrContent, typ)
			}
		}
	default:
		return jinja.Undefined(), fmt.Errorf("%w: content of type %s", ErrContent, c.Kind())
	}
	if openai {
		items := make([]jinja.Value, len(parts))
		for i, p := range parts {
			d := jinja.NewDict()
			d.AsDict().Set("type", jinja.NewString("text"))
			d.AsDict().Set("text", jinja.NewString(p))
			items[i] = d
		}
		return jinja.NewList(items), nil
	}
	kept := parts[:0]
	for _, p := range parts {
		if p != "" {
			kept = append(kept, p)
		}
	}
	return jinja.NewString(strings.Join(kept, "\n")), nil
}

// normalizeToolCall copies an assistant tool call with function.arguments parsed from
// its JSON string into an object (invalid or empty → {}), key order kept.
func normalizeToolCall(tc jsonvalue.Value) jinja.Value {
	if tc.Kind() != jsonvalue.Object {
		return toJinja(tc)
	}
	d := jinja.NewDict()
	dict := d.AsDict()
	for _, k := range []string{"id", "type"} {
		if v, ok := tc.Get(k); ok {
			dict.Set(k, toJinja(v))
		}
	}
	if fn := tc.Field("function"); fn.Kind() == jsonvalue.Object {
		f := jinja.NewDict()
		if v, ok := fn.Get("name"); ok {
			f.AsDict().Set("name", toJinja(v))
		}
		args := jinja.NewDict()
		switch a := fn.Field("arguments"); a.Kind() {
		case jsonvalue.String:
			if v, err := decodeOrdered([]byte(a.Text())); err == nil {
				args = v // any valid JSON, as json.loads; invalid or empty → {}
			}
		case jsonvalue.Object, jsonvalue.Array:
			args = toJinja(a)
		}
		f.AsDict().Set("arguments", args)
		dict.Set("function", f)
	}
	for _, m := range tc.Members() {
		if m.Key != "id" && m.Key != "type" && m.Key != "function" {
			dict.Set(m.Key, toJinja(m.Value))
		}
	}
	return d
}

// normalizeTools returns vLLM's tool list: {"type":"function","function":{"name",
// "description","parameters"[,"strict"]}}, missing description/parameters as null;
// None when the request has no tools. Anthropic tools (name, description,
// input_schema) map to the same form.
func normalizeTools(req *request.Request) (jinja.Value, error) {
	if len(req.Tools) == 0 {
		return jinja.None(), nil
	}
	field := func(v jsonvalue.Value, k string) jinja.Value {
		if x, ok := v.Get(k); ok {
			return toJinja(x)
		}
		return jinja.Undefined()
	}
	out := make([]jinja.Value, 0, len(req.Tools))
	for _, t := range req.Tools {
		var name, desc, params, strict jinja.Value
		if fn := t.Field("function"); fn.Kind() == jsonvalue.Object {
			name, desc, params, strict = field(fn, "name"), field(fn, "description"), field(fn, "parameters"), field(fn, "strict")
		} else { // Anthropic form
			name, desc, params = field(t, "name"), field(t, "description"), field(t, "input_schema")
			strict = jinja.Undefined()
		}
		f := jinja.NewDict()
		fd := f.AsDict()
		fd.Set("name", orNone(name))
		fd.Set("description", orNone(desc))
		fd.Set("parameters", orNone(params))
		if !strict.IsUndefined() && !strict.IsNone() {
			fd.Set("strict", strict)
		}
		d := jinja.NewDict()
		d.AsDict().Set("type", jinja.NewString("function"))
		d.AsDict().Set("function", f)
		out = append(out, d)
	}
	return jinja.NewList(out), nil
}

func orNone(v jinja.Value) jinja.Value {
	if v.IsUndefined() {
		return jinja.None()
	}
	return v
}

// anthropicToChat converts an Anthropic /v1/messages conversation to the chat form
// vLLM's Anthropic endpoint renders (vllm/entrypoints/anthropic/serving.py,
// _convert_anthropic_to_openai_request): the top-level system and any system-role
// messages become one system message (non-empty text blocks joined with "", Claude
// Code's per-request "x-anthropic-billing-header" block dropped); text blocks become
// the content (one text block → a string); thinking blocks become "reasoning";
// tool_use blocks become tool_calls with JSON arguments (key order and numbers as
// sent); a user's tool_result blocks become tool messages placed before the message;
// a user message left without content is dropped. Images are ErrContent (the remote
// path handles them).
func anthropicToChat(system jsonvalue.Value, msgs []jsonvalue.Value) ([]jsonvalue.Value, error) {
	var sys []string
	addSystem := func(c jsonvalue.Value) error {
		switch c.Kind() {
		case jsonvalue.Null:
		case jsonvalue.String:
			sys = append(sys, c.Text())
		case jsonvalue.Array:
			for i := range c.Len() {
				b := c.Index(i)
				t, _ := b.Field("text").Str()
				if typ, _ := b.Field("type").Str(); typ == "text" && t != "" && !strings.HasPrefix(t, "x-anthropic-billing-header") {
					sys = append(sys, t)
				}
			}
		default:
			return fmt.Errorf("%w: system of type %s", ErrContent, c.Kind())
		}
		return nil
	}
	if err := addSystem(system); err != nil {
		return nil, err
	}
	for _, msg := range msgs {
		if role, _ := msg.Field("role").Str(); role == "system" {
			if err := addSystem(msg.Field("content")); err != nil {
				return nil, err
			}
		}
	}
	str := jsonvalue.StringValue
	var out []jsonvalue.Value
	if len(sys) > 0 {
		out = append(out, jsonvalue.ObjectValue(jsonvalue.Member{Key: "role", Value: str("system")},
			jsonvalue.Member{Key: "content", Value: str(strings.Join(sys, ""))}))
	}
	for i, msg := range msgs {
		role, _ := msg.Field("role").Str()
		if role == "system" {
			continue
		}
		m := []jsonvalue.Member{{Key: "role", Value: str(role)}}
		content := msg.Field("content")
		if content.Kind() != jsonvalue.Array {
			out = append(out, jsonvalue.ObjectValue(append(m, jsonvalue.Member{Key: "content", Value: content})...))
			continue
		}
		var parts []jsonvalue.Value
		var texts []string
		var calls []jsonvalue.Value
		var reasoning []string
		for j := range content.Len() {
			b := content.Index(j)
			typ, _ := b.Field("type").Str()
			switch typ {
			case "text":
				if t, _ := b.Field("text").Str(); t != "" {
					parts = append(parts, jsonvalue.ObjectValue(jsonvalue.Member{Key: "type", Value: str("text")}, jsonvalue.Member{Key: "text", Value: str(t)}))
					texts = append(texts, t)
				}
			case "thinking":
				if t, ok := b.Field("thinking").Str(); ok {
					reasoning = append(reasoning, t)
				}
			case "tool_use":
				input := b.Field("input")
				if input.IsNull() {
					input = jsonvalue.ObjectValue()
				}
				id, _ := b.Field("id").Str()
				name, _ := b.Field("name").Str()
				calls = append(calls, jsonvalue.ObjectValue(
					jsonvalue.Member{Key: "id", Value: str(id)},
					jsonvalue.Member{Key: "type", Value: str("function")},
					jsonvalue.Member{Key: "function", Value: jsonvalue.ObjectValue(
						jsonvalue.Member{Key: "name", Value: str(name)},
						jsonvalue.Member{Key: "arguments", Value: str(string(input.AppendJSON(nil)))})}))
			case "tool_result":
				text, err := toolResultText(b.Field("content"))
				if err != nil {
					return nil, fmt.Errorf("messages[%d]: %w", i, err)
				}
				if role == "user" {
					id, _ := b.Field("tool_use_id").Str()
					out = append(out, jsonvalue.ObjectValue(jsonvalue.Member{Key: "role", Value: str("tool")},
						jsonvalue.Member{Key: "tool_call_id", Value: str(id)}, jsonvalue.Member{Key: "content", Value: str(text)}))
				} else {
					t := "Tool result: " + text
					parts = append(parts, jsonvalue.ObjectValue(jsonvalue.Member{Key: "type", Value: str("text")}, jsonvalue.Member{Key: "text", Value: str(t)}))
					texts = append(texts, t)
				}
			case "image":
				return nil, fmt.Errorf("messages[%d]: %w: image block", i, ErrContent)
			}
		}
		switch {
		case len(parts) == 1:
			m = append(m, jsonvalue.Member{Key: "content", Value: str(texts[0])})
		case len(parts) > 1:
			m = append(m, jsonvalue.Member{Key: "content", Value: jsonvalue.ArrayValue(parts...)})
		}
		if len(reasoning) > 0 {
			m = append(m, jsonvalue.Member{Key: "reasoning", Value: str(strings.Join(reasoning, ""))})
		}
		if len(calls) > 0 {
			m = append(m, jsonvalue.Member{Key: "tool_calls", Value: jsonvalue.ArrayValue(calls...)})
		}
		if role == "user" && len(parts) == 0 {
			continue
		}
		out = append(out, jsonvalue.ObjectValue(m...))
	}
	return out, nil
}

// toolResultText is a tool_result's text: a string as is, text blocks joined with "\n".
func toolResultText(c jsonvalue.Value) (string, error) {
	switch c.Kind() {
	case jsonvalue.Null:
		return "", nil
	case jsonvalue.String:
		return c.Text(), nil
	case jsonvalue.Array:
		var texts []string
		for i := range c.Len() {
			b := c.Index(i)
			switch typ, _ := b.Field("type").Str(); typ {
			case "text":
				t, _ := b.Field("text").Str()
				texts = append(texts, t)
			case "image":
				return "", fmt.Errorf("%w: image in a tool_result", ErrContent)
			}
		}
		return strings.Join(texts, "\n"), nil
	}
	return "", fmt.Errorf("%w: tool_result content of type %s", ErrContent, c.Kind())
}
