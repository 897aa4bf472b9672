package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/ardanlabs/jinja"

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
}

// contentLoop finds `for x in message['content']` / `message.content` style loops,
// which is what vLLM's _detect_content_format looks for in the template AST
// (vllm/entrypoints/chat_utils.py).
var contentLoop = regexp.MustCompile(`\{%-?\s*for\s+\w+\s+in\s+\w+(?:\[\s*['"]content['"]\s*\]|\.content)\s*(?:\||-?%\})`)

func compileChatTemplate(src string) (*chatTemplate, error) {
	t, err := jinja.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("%w: does not compile: %v", ErrTemplate, err)
	}
	ct := &chatTemplate{tmpl: t, src: src, openai: contentLoop.MatchString(src)}
	// Render a small conversation once so that a template using something the engine
	// lacks (an unknown filter or method) is reported at load time, not per request.
	probe := []map[string]any{{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
		{"role": "assistant", "content": "a"}, {"role": "user", "content": "u"}}
	vars := map[string]jinja.Value{"messages": fromGo(probe), "add_generation_prompt": jinja.NewBool(true)}
	if _, err := t.RenderValues(vars); err != nil && !strings.Contains(err.Error(), "raise_exception") {
		return nil, fmt.Errorf("%w: cannot render a plain conversation: %v", ErrTemplate, err)
	}
	return ct, nil
}

// RenderChat renders a chat or Anthropic messages request with the model's chat
// template as vLLM does before tokenizing (see ../shared/reference/vllm-chat-rendering.md):
// messages normalized (reasoning_content → reasoning, tool_calls arguments parsed,
// content as string or OpenAI parts per the template), tools normalized, template
// variables add_generation_prompt (default true), continue_final_message, the special
// tokens, chat_template_kwargs, and reasoning_effort → enable_thinking.
// The result is tokenized with EncodeText(text, false).
func (m *Model) RenderChat(req *request.Request) (string, error) {
	if m.chat == nil {
		return "", m.chatErr
	}
	msgs := req.Messages
	if req.API == request.APIMessages {
		var err error
		if msgs, err = anthropicToChat(req.System, req.Messages); err != nil {
			return "", err
		}
	}
	conv, err := normalizeMessages(msgs, m.chat.openai)
	if err != nil {
		return "", err
	}
	vars := map[string]jinja.Value{}
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
		return "", err
	}
	vars["tools"] = tools
	vars["documents"] = jinja.None()
	agp := true
	if req.AddGenerationPrompt != nil {
		agp = *req.AddGenerationPrompt
	}
	if agp && req.ContinueFinalMessage {
		return "", fmt.Errorf("%w: add_generation_prompt and continue_final_message are both set", ErrTemplate)
	}
	vars["add_generation_prompt"] = jinja.NewBool(agp)
	vars["continue_final_message"] = jinja.NewBool(req.ContinueFinalMessage)
	if req.ReasoningEffort != "" {
		vars["reasoning_effort"] = jinja.NewString(req.ReasoningEffort)
		if _, given := req.ChatTemplateKwargs["enable_thinking"]; !given {
			vars["enable_thinking"] = jinja.NewBool(req.ReasoningEffort != "none")
		}
	}
	for k, v := range req.ChatTemplateKwargs {
		if k == "messages" {
			continue
		}
		vars[k] = fromGo(v)
	}
	vars["messages"] = conv
	out, err := m.chat.tmpl.RenderValues(vars)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrTemplate, err)
	}
	if req.ContinueFinalMessage {
		if out, err = trimAfterFinal(out, conv); err != nil {
			return "", err
		}
	}
	return out, nil
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
func normalizeMessages(msgs []map[string]any, openai bool) (jinja.Value, error) {
	out := make([]jinja.Value, 0, len(msgs))
	for i, msg := range msgs {
		role, _ := msg["role"].(string)
		d := jinja.NewDict()
		dict := d.AsDict()
		dict.Set("role", jinja.NewString(role))
		content, err := normalizeContent(msg["content"], openai)
		if err != nil {
			return jinja.Undefined(), fmt.Errorf("messages[%d]: %w", i, err)
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
			if tcs, ok := msg["tool_calls"].([]any); ok && len(tcs) > 0 {
				calls := make([]jinja.Value, 0, len(tcs))
				for _, tc := range tcs {
					calls = append(calls, normalizeToolCall(tc))
				}
				dict.Set("tool_calls", jinja.NewList(calls))
			}
			r, ok := msg["reasoning"]
			if !ok {
				r, ok = msg["reasoning_content"]
			}
			if ok && r != nil {
				dict.Set("reasoning", fromGo(r))
				dict.Set("reasoning_content", fromGo(r))
			}
		}
		if id, ok := msg["tool_call_id"]; ok && role == "tool" {
			dict.Set("tool_call_id", fromGo(id))
		}
		for _, k := range []string{"name", "task"} {
			if v, ok := msg[k].(string); ok {
				dict.Set(k, jinja.NewString(v))
			}
		}
		out = append(out, d)
	}
	return jinja.NewList(out), nil
}

// normalizeContent applies vLLM's content format: "string" joins text parts with "\n"
// (empty parts dropped, null → ""); "openai" passes a list of text parts (null → []).
func normalizeContent(c any, openai bool) (jinja.Value, error) {
	var parts []string
	switch x := c.(type) {
	case nil:
	case string:
		if !openai {
			return jinja.NewString(x), nil
		}
		parts = []string{x}
	case []any:
		for _, p := range x {
			pm, ok := p.(map[string]any)
			if !ok {
				if s, ok := p.(string); ok {
					parts = append(parts, s)
					continue
				}
				return jinja.Undefined(), fmt.Errorf("%w: content part %T", ErrContent, p)
			}
			typ, _ := pm["type"].(string)
			key := "text"
			switch typ {
			case "refusal", "thinking":
				key = typ
				fallthrough
			case "text", "input_text", "output_text":
				s, ok := pm[key].(string)
				if !ok {
					continue // a part without its text is skipped, as vLLM does
				}
				parts = append(parts, s)
			default:
				return jinja.Undefined(), fmt.Errorf("%w: content part type %q", ErrContent, typ)
			}
		}
	default:
		return jinja.Undefined(), fmt.Errorf("%w: content of type %T", ErrContent, c)
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
func normalizeToolCall(tc any) jinja.Value {
	m, ok := tc.(map[string]any)
	if !ok {
		return fromGo(tc)
	}
	d := jinja.NewDict()
	dict := d.AsDict()
	for _, k := range []string{"id", "type"} {
		if v, ok := m[k]; ok {
			dict.Set(k, fromGo(v))
		}
	}
	if fn, ok := m["function"].(map[string]any); ok {
		f := jinja.NewDict()
		if v, ok := fn["name"]; ok {
			f.AsDict().Set("name", fromGo(v))
		}
		args := jinja.NewDict()
		switch a := fn["arguments"].(type) {
		case string:
			if v, err := decodeOrdered([]byte(a)); err == nil {
				args = v // any valid JSON, as json.loads; invalid or empty → {}
			}
		case map[string]any, []any:
			args = fromGo(a)
		}
		f.AsDict().Set("arguments", args)
		dict.Set("function", f)
	}
	for k, v := range m {
		if k != "id" && k != "type" && k != "function" {
			dict.Set(k, fromGo(v))
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
	var list jinja.Value
	if len(req.RawTools) > 0 {
		v, err := decodeOrdered(req.RawTools)
		if err != nil || !v.IsList() {
			return jinja.Undefined(), fmt.Errorf("%w: tools: %v", ErrContent, err)
		}
		list = v
	} else {
		list = fromGo(req.Tools)
	}
	out := make([]jinja.Value, 0, len(list.AsList().Items))
	for _, t := range list.AsList().Items {
		fn := get(t, "function")
		var name, desc, params, strict jinja.Value
		if fn.IsDict() {
			name, desc, params, strict = get(fn, "name"), get(fn, "description"), get(fn, "parameters"), get(fn, "strict")
		} else { // Anthropic form
			name, desc, params = get(t, "name"), get(t, "description"), get(t, "input_schema")
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
// tool_use blocks become tool_calls with JSON arguments; a user's tool_result blocks
// become tool messages placed before the message; a user message left without content
// is dropped. Images are ErrContent (the remote path handles them).
func anthropicToChat(system any, msgs []map[string]any) ([]map[string]any, error) {
	var sys []string
	addSystem := func(c any) error {
		switch x := c.(type) {
		case nil:
		case string:
			sys = append(sys, x)
		case []any:
			for _, b := range x {
				bm, _ := b.(map[string]any)
				t, _ := bm["text"].(string)
				if bm["type"] == "text" && t != "" && !strings.HasPrefix(t, "x-anthropic-billing-header") {
					sys = append(sys, t)
				}
			}
		default:
			return fmt.Errorf("%w: system of type %T", ErrContent, c)
		}
		return nil
	}
	if err := addSystem(system); err != nil {
		return nil, err
	}
	for _, msg := range msgs {
		if msg["role"] == "system" {
			if err := addSystem(msg["content"]); err != nil {
				return nil, err
			}
		}
	}
	var out []map[string]any
	if len(sys) > 0 {
		out = append(out, map[string]any{"role": "system", "content": strings.Join(sys, "")})
	}
	for i, msg := range msgs {
		role, _ := msg["role"].(string)
		if role == "system" {
			continue
		}
		m := map[string]any{"role": role}
		blocks, isList := msg["content"].([]any)
		if !isList {
			m["content"] = msg["content"]
			out = append(out, m)
			continue
		}
		var parts []any
		var calls []any
		var reasoning []string
		for _, b := range blocks {
			bm, _ := b.(map[string]any)
			switch bm["type"] {
			case "text":
				if t, _ := bm["text"].(string); t != "" {
					parts = append(parts, map[string]any{"type": "text", "text": t})
				}
			case "thinking":
				if t, ok := bm["thinking"].(string); ok {
					reasoning = append(reasoning, t)
				}
			case "tool_use":
				input := bm["input"]
				if input == nil {
					input = map[string]any{}
				}
				args, _ := json.Marshal(input)
				id, _ := bm["id"].(string)
				name, _ := bm["name"].(string)
				calls = append(calls, map[string]any{"id": id, "type": "function",
					"function": map[string]any{"name": name, "arguments": string(args)}})
			case "tool_result":
				text, err := toolResultText(bm["content"])
				if err != nil {
					return nil, fmt.Errorf("messages[%d]: %w", i, err)
				}
				if role == "user" {
					id, _ := bm["tool_use_id"].(string)
					out = append(out, map[string]any{"role": "tool", "tool_call_id": id, "content": text})
				} else {
					parts = append(parts, map[string]any{"type": "text", "text": "Tool result: " + text})
				}
			case "image":
				return nil, fmt.Errorf("messages[%d]: %w: image block", i, ErrContent)
			}
		}
		if len(reasoning) > 0 {
			m["reasoning"] = strings.Join(reasoning, "")
		}
		if len(calls) > 0 {
			m["tool_calls"] = calls
		}
		switch {
		case len(parts) == 1:
			m["content"] = parts[0].(map[string]any)["text"]
		case len(parts) > 1:
			m["content"] = parts
		}
		if _, has := m["content"]; role == "user" && !has {
			continue
		}
		out = append(out, m)
	}
	return out, nil
}

// toolResultText is a tool_result's text: a string as is, text blocks joined with "\n".
func toolResultText(c any) (string, error) {
	switch x := c.(type) {
	case nil:
		return "", nil
	case string:
		return x, nil
	case []any:
		var texts []string
		for _, b := range x {
			bm, _ := b.(map[string]any)
			switch bm["type"] {
			case "text":
				t, _ := bm["text"].(string)
				texts = append(texts, t)
			case "image":
				return "", fmt.Errorf("%w: image in a tool_result", ErrContent)
			}
		}
		return strings.Join(texts, "\n"), nil
	}
	return "", fmt.Errorf("%w: tool_result content of type %T", ErrContent, c)
}
