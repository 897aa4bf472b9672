package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Anthropic Messages API (POST /v1/messages) as vLLM serves it
// (vllm/entrypoints/anthropic/api_router.py and serving.py, AnthropicServingMessages):
// the request is converted to a chat completion request and run by the same engine,
// and the chat answer converted back.
//
//   - Whole answer: {"id", "type":"message", "role":"assistant", "content":[{"type":"text",
//     "text"}], "model", "stop_reason", "usage":{"input_tokens","output_tokens"}}; the id
//     is the chat completion's ("chatcmpl-…"), stop_reason maps vLLM's finish reason
//     (stop → end_turn, length → max_tokens).
//   - Stream (text/event-stream, each event "event: <type>\ndata: <json>\n\n"):
//     message_start (usage.input_tokens = the prompt's tokens, output_tokens 0),
//     content_block_start (index 0, an empty text block), content_block_delta
//     (text_delta) per token, content_block_stop, message_delta (delta.stop_reason and
//     usage {input_tokens, output_tokens}), message_stop. vLLM sends no ping event;
//     WorkerOptions.AnthropicPing adds one after content_block_start, where Anthropic's
//     API sends it.
//   - Usage: input_tokens is every prompt token, cached or not (vLLM copies
//     prompt_tokens), and vLLM reports no cache_read_input_tokens or
//     cache_creation_input_tokens, so neither does the simulator.
//   - Errors: HTTP status and {"type":"error","error":{"type","message"}}, the type being
//     vLLM's error class name (BadRequestError, NotFoundError), as translate_error_response
//     writes them.
//
// Content blocks other than text (images, tool_use, tool_result, thinking) are refused
// with a 400: the simulator's stand-in engine generates text only.

// anthropicError writes vLLM's Anthropic-shape error body.
func anthropicError(rw http.ResponseWriter, status int, typ, msg string) {
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(status)
	_ = json.NewEncoder(rw).Encode(map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}})
}

type messagesBody struct {
	Model     string          `json:"model"`
	Messages  []anthMsg       `json:"messages"`
	System    json.RawMessage `json:"system"`
	MaxTokens *int            `json:"max_tokens"`
	Stream    bool            `json:"stream"`
}

type anthMsg struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type anthBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// anthText decodes content that is a string or a list of text blocks; texts are the
// non-empty text blocks in order (vLLM drops empty ones).
func anthText(raw json.RawMessage, where string) (s string, texts []string, isString bool, err error) {
	if json.Unmarshal(raw, &s) == nil {
		return s, nil, true, nil
	}
	var blocks []anthBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", nil, false, fmt.Errorf("%s must be a string or a list of content blocks", where)
	}
	for _, b := range blocks {
		if b.Type != "text" {
			return "", nil, false, fmt.Errorf("%s: content block type %q is not supported by vllm-sim (text only)", where, b.Type)
		}
		if b.Text != "" {
			texts = append(texts, b.Text)
		}
	}
	return "", texts, false, nil
}

// chatMessages converts an Anthropic conversation to chat messages as vLLM's
// _convert_anthropic_to_openai_request does: the top-level system and system-role
// messages join into one leading system message (Claude Code's
// "x-anthropic-billing-header" block dropped); one text block becomes a string content,
// several a list of text parts; a user message left without content is dropped.
func (b *messagesBody) chatMessages() ([]map[string]any, error) {
	if len(b.Messages) == 0 {
		return nil, fmt.Errorf("messages must contain at least one item")
	}
	var sys []string
	addSys := func(raw json.RawMessage, where string) error {
		s, texts, isString, err := anthText(raw, where)
		if err != nil {
			return err
		}
		if isString {
			texts = []string{s}
		}
		for _, t := range texts {
			if t != "" && !strings.HasPrefix(t, "x-anthropic-billing-header") {
				sys = append(sys, t)
			}
		}
		return nil
	}
	if len(b.System) > 0 && string(b.System) != "null" {
		if err := addSys(b.System, "system"); err != nil {
			return nil, err
		}
	}
	var out []map[string]any
	for i, m := range b.Messages {
		where := fmt.Sprintf("messages[%d].content", i)
		switch m.Role {
		case "system":
			if err := addSys(m.Content, where); err != nil {
				return nil, err
			}
			continue
		case "user", "assistant":
		default:
			return nil, fmt.Errorf("messages[%d].role must be user, assistant or system, got %q", i, m.Role)
		}
		if string(m.Content) == "[]" {
			return nil, fmt.Errorf("message content must not be empty")
		}
		s, texts, isString, err := anthText(m.Content, where)
		if err != nil {
			return nil, err
		}
		msg := map[string]any{"role": m.Role}
		switch {
		case isString:
			msg["content"] = s
		case len(texts) == 1:
			msg["content"] = texts[0]
		case len(texts) > 1:
			parts := make([]map[string]any, len(texts))
			for k, t := range texts {
				parts[k] = map[string]any{"type": "text", "text": t}
			}
			msg["content"] = parts
		case m.Role == "user":
			continue
		}
		out = append(out, msg)
	}
	if len(sys) > 0 {
		out = append([]map[string]any{{"role": "system", "content": strings.Join(sys, "")}}, out...)
	}
	return out, nil
}

func (w *Worker) handleMessages(rw http.ResponseWriter, r *http.Request) {
	arrival := w.opt.Now()
	raw, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		anthropicError(rw, http.StatusBadRequest, "BadRequestError", "reading body: "+err.Error())
		return
	}
	var body messagesBody
	if err := json.Unmarshal(raw, &body); err != nil {
		anthropicError(rw, http.StatusBadRequest, "BadRequestError", "invalid JSON body: "+err.Error())
		return
	}
	if body.Model == "" {
		anthropicError(rw, http.StatusBadRequest, "BadRequestError", "Model is required")
		return
	}
	if body.MaxTokens == nil {
		anthropicError(rw, http.StatusBadRequest, "BadRequestError", "max_tokens: Field required")
		return
	}
	if *body.MaxTokens <= 0 {
		anthropicError(rw, http.StatusBadRequest, "BadRequestError", "max_tokens must be positive")
		return
	}
	adapter, ok := w.modelFor(rw, body.Model, anthropicError)
	if !ok {
		return
	}
	msgs, err := body.chatMessages()
	if err != nil {
		anthropicError(rw, http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	var prompt []uint32
	if w.opt.TextTokens != nil {
		chatBody, _ := json.Marshal(map[string]any{"model": body.Model, "messages": msgs})
		if prompt, err = w.opt.TextTokens(true, chatBody); err != nil {
			anthropicError(rw, http.StatusBadRequest, "BadRequestError", err.Error())
			return
		}
	} else {
		cm := make([]ChatMessage, len(msgs))
		for i, m := range msgs {
			cm[i] = ChatMessage{Role: m["role"].(string), Content: partsText(m["content"])}
		}
		prompt = w.opt.Tokenizer.Chat(cm, true)
	}
	w.generate(rw, r, arrival, job{api: "messages", prompt: prompt, maxTokens: *body.MaxTokens, adapter: adapter, stream: body.Stream}, anthropicError)
}

// partsText is a converted message's content as one text (the stand-in tokenizer's view).
func partsText(c any) string {
	if s, ok := c.(string); ok {
		return s
	}
	var b strings.Builder
	for _, p := range c.([]map[string]any) {
		b.WriteString(p["text"].(string))
	}
	return b.String()
}

// anthUsage is the usage object of vLLM's Anthropic answers.
type anthUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// stopReason is the Anthropic stop_reason of the simulator's finish reason ("length":
// every simulated request runs to max_tokens).
const stopReason = "max_tokens"

func (s *stream) messagesWhole(r *http.Request, req *Request, ch <-chan Output, promptLen int) {
	text, fin, ok := s.collect(r, req, ch)
	if !ok {
		return
	}
	s.rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(s.rw).Encode(map[string]any{"id": s.id, "type": "message", "role": "assistant",
		"content": []any{map[string]any{"type": "text", "text": string(text)}}, "model": s.model,
		"stop_reason": stopReason, "usage": anthUsage{InputTokens: promptLen, OutputTokens: fin.Generated}})
}

// namedEvent writes one SSE event with an event line, as vLLM's wrap_data_with_event.
func (s *stream) namedEvent(typ string, v any) error {
	b, _ := json.Marshal(v)
	if _, err := fmt.Fprintf(s.rw, "event: %s\ndata: %s\n\n", typ, b); err != nil {
		return err
	}
	if f, ok := s.rw.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

func (s *stream) messagesSSE(r *http.Request, req *Request, ch <-chan Output, promptLen int) {
	h := s.rw.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	s.rw.WriteHeader(http.StatusOK)
	start := map[string]any{"type": "message_start", "message": map[string]any{"id": s.id, "type": "message", "role": "assistant",
		"content": []any{}, "model": s.model, "stop_reason": nil, "stop_sequence": nil, "usage": anthUsage{InputTokens: promptLen}}}
	if s.namedEvent("message_start", start) != nil {
		s.w.Runner.Cancel(req)
		return
	}
	var last time.Time
	started := false
	for {
		select {
		case <-r.Context().Done():
			s.w.Runner.Cancel(req)
			return
		case o, ok := <-ch:
			if !ok {
				return
			}
			s.observe(o, &last)
			var err error
			if text := s.w.opt.Tokenizer.Decode(o.Token); text != "" {
				if !started {
					started = true
					err = s.namedEvent("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
						"content_block": map[string]any{"type": "text", "text": ""}})
					if err == nil && s.w.opt.AnthropicPing {
						err = s.namedEvent("ping", map[string]any{"type": "ping"})
					}
				}
				if err == nil {
					err = s.namedEvent("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
						"delta": map[string]any{"type": "text_delta", "text": text}})
				}
			}
			if err != nil {
				s.w.Runner.Cancel(req)
				return
			}
			if !o.Finished {
				continue
			}
			if started {
				_ = s.namedEvent("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
			}
			_ = s.namedEvent("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stopReason},
				"usage": anthUsage{InputTokens: promptLen, OutputTokens: o.Generated}})
			_ = s.namedEvent("message_stop", map[string]any{"type": "message_stop"})
			return
		}
	}
}
