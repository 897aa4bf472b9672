// Package request parses inference request bodies (OpenAI chat completions, OpenAI
// completions, Anthropic messages) into one normalized Request that the router,
// the tokenizer and the scorer share. It knows nothing of Envoy or HTTP framing.
package request

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// API names the request shape a body was parsed as.
type API string

const (
	APIChat        API = "chat"        // POST /v1/chat/completions (OpenAI)
	APICompletions API = "completions" // POST /v1/completions (OpenAI)
	APIMessages    API = "messages"    // POST /v1/messages (Anthropic)
	APIOther       API = "other"       // any other path: passed through, load-only pick
)

// APIForPath maps a request path (query string ignored) to the API it carries.
func APIForPath(path string) API {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	path = strings.TrimSuffix(path, "/")
	switch path {
	case "/v1/chat/completions":
		return APIChat
	case "/v1/completions":
		return APICompletions
	case "/v1/messages":
		return APIMessages
	}
	return APIOther
}

// Request is one normalized inference request.
//
// Messages and Tools keep the client's JSON objects as decoded maps so that a chat
// template sees every field (tool_calls, reasoning, multi-part content) exactly as sent.
type Request struct {
	API   API
	Model string // "model" field; the served model name or a LoRA adapter name

	// Chat / messages APIs.
	System               any              // Anthropic top-level "system" (string or content blocks); nil otherwise
	Messages             []map[string]any // chat messages in order
	Tools                []map[string]any // tool definitions (OpenAI or Anthropic form)
	AddGenerationPrompt  *bool            // chat: add_generation_prompt (vLLM default true)
	ContinueFinalMessage bool             // chat: continue_final_message
	ChatTemplateKwargs   map[string]any   // chat: chat_template_kwargs
	ReasoningEffort      string           // chat: reasoning_effort

	// Completions API: exactly one of Prompts or PromptTokenIDs is set.
	Prompts          []string   // prompt as string or list of strings
	PromptTokenIDs   [][]uint32 // prompt as token ids or list of token-id lists
	AddSpecialTokens *bool      // completions/chat override of add_special_tokens

	Stream       bool // "stream": true → SSE response
	IncludeUsage bool // stream_options.include_usage
	// MaxTokens is the output token limit (max_completion_tokens, max_tokens); 0 when absent.
	MaxTokens int
	CacheSalt string // vLLM cache_salt: isolates the prefix cache namespace

	// RawTools is the "tools" JSON as sent: chat templates emit tools with tojson in
	// the client's key order, which Tools (Go maps) loses. nil when absent.
	RawTools json.RawMessage
}

// Error is a client error with the HTTP status and OpenAI error type it maps to.
type Error struct {
	Status  int    // HTTP status, 4xx
	Type    string // OpenAI error type, e.g. "invalid_request_error"
	Param   string // offending field, if any
	Message string
}

func (e *Error) Error() string { return e.Message }

// ErrEmptyBody is returned for a body-carrying API with an empty body.
var ErrEmptyBody = &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Message: "request body is empty"}

func invalid(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Message: fmt.Sprintf(format, args...)}
}

// AsError returns err as *Error if it is one.
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}

// wire is the union of the fields kvroute reads from all three APIs.
type wire struct {
	Model         string           `json:"model"`
	Messages      []map[string]any `json:"messages"`
	System        any              `json:"system"`
	Tools         json.RawMessage  `json:"tools"`
	Prompt        json.RawMessage  `json:"prompt"`
	Stream        bool             `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens            *int           `json:"max_tokens"`
	MaxCompletionTokens  *int           `json:"max_completion_tokens"`
	AddGenerationPrompt  *bool          `json:"add_generation_prompt"`
	ContinueFinalMessage bool           `json:"continue_final_message"`
	ChatTemplateKwargs   map[string]any `json:"chat_template_kwargs"`
	ReasoningEffort      string         `json:"reasoning_effort"`
	AddSpecialTokens     *bool          `json:"add_special_tokens"`
	CacheSalt            string         `json:"cache_salt"`
}

// Parse decodes body as the given API. Errors are *Error with a 4xx status.
// For APIOther it returns a Request with only Model filled when the body is a JSON
// object with a "model" string, and never fails.
func Parse(api API, body []byte) (*Request, error) {
	if api == APIOther {
		r := &Request{API: APIOther}
		var m struct {
			Model string `json:"model"`
		}
		if len(body) > 0 && json.Unmarshal(body, &m) == nil {
			r.Model = m.Model
		}
		return r, nil
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil, ErrEmptyBody
	}
	var w wire
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, invalid("", "request body is not valid JSON for %s: %v", api, err)
	}
	if w.Model == "" {
		return nil, invalid("model", "field 'model' is required")
	}
	r := &Request{
		API: api, Model: w.Model, Stream: w.Stream,
		AddGenerationPrompt: w.AddGenerationPrompt, ContinueFinalMessage: w.ContinueFinalMessage,
		ChatTemplateKwargs: w.ChatTemplateKwargs, ReasoningEffort: w.ReasoningEffort,
		AddSpecialTokens: w.AddSpecialTokens, CacheSalt: w.CacheSalt,
	}
	if w.StreamOptions != nil {
		r.IncludeUsage = w.StreamOptions.IncludeUsage
	}
	if len(w.Tools) > 0 && string(w.Tools) != "null" {
		if err := json.Unmarshal(w.Tools, &r.Tools); err != nil {
			return nil, invalid("tools", "field 'tools' must be an array of objects: %v", err)
		}
		r.RawTools = w.Tools
	}
	switch {
	case w.MaxCompletionTokens != nil:
		r.MaxTokens = *w.MaxCompletionTokens
	case w.MaxTokens != nil:
		r.MaxTokens = *w.MaxTokens
	}
	if r.MaxTokens < 0 {
		return nil, invalid("max_tokens", "max_tokens must be ≥ 0, got %d", r.MaxTokens)
	}
	switch api {
	case APIChat, APIMessages:
		if len(w.Messages) == 0 {
			return nil, invalid("messages", "field 'messages' must be a non-empty array")
		}
		for i, m := range w.Messages {
			if m == nil {
				return nil, invalid("messages", "messages[%d] must be an object", i)
			}
			if _, ok := m["role"].(string); !ok {
				return nil, invalid("messages", "messages[%d].role must be a string", i)
			}
		}
		r.Messages = w.Messages
		if api == APIMessages {
			r.System = w.System
			if w.MaxTokens == nil {
				return nil, invalid("max_tokens", "field 'max_tokens' is required for /v1/messages")
			}
		}
	case APICompletions:
		if err := parsePrompt(w.Prompt, r); err != nil {
			return nil, err
		}
	default:
		return nil, invalid("", "unsupported API %q", api)
	}
	return r, nil
}

// parsePrompt accepts a string, a list of strings, a list of token ids, or a list of
// token-id lists, as vLLM's /v1/completions does.
func parsePrompt(raw json.RawMessage, r *Request) error {
	if len(raw) == 0 || string(raw) == "null" {
		return invalid("prompt", "field 'prompt' is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		r.Prompts = []string{s}
		return nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil && len(ss) > 0 {
		r.Prompts = ss
		return nil
	}
	var ids []uint32
	if json.Unmarshal(raw, &ids) == nil && len(ids) > 0 {
		r.PromptTokenIDs = [][]uint32{ids}
		return nil
	}
	var idss [][]uint32
	if json.Unmarshal(raw, &idss) == nil && len(idss) > 0 {
		for i, p := range idss {
			if len(p) == 0 {
				return invalid("prompt", "prompt[%d] is an empty token list", i)
			}
		}
		r.PromptTokenIDs = idss
		return nil
	}
	return invalid("prompt", "field 'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists")
}

// ErrorJSON renders an OpenAI-style error body:
// {"error":{"message":…,"type":…,"param":…,"code":status}}.
func ErrorJSON(status int, typ, param, message string) []byte {
	var p any
	if param != "" {
		p = param
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": message, "type": typ, "param": p, "code": status,
	}})
	return b
}

// TooLarge is the error for a body longer than limit bytes (HTTP 413).
func TooLarge(limit int) *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
		Message: fmt.Sprintf("request body exceeds the limit of %d bytes", limit)}
}

// SniffModel returns the top-level "model" string of a JSON object that may be
// truncated (a BUFFERED_PARTIAL body cut at Envoy's buffer limit): it reads tokens until
// it finds the key and stops there, so a model field that precedes the cut is found.
// It returns "" when the body is not a JSON object or the field is absent or cut.
func SniffModel(body []byte) string {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return ""
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return ""
		}
		if k == "model" {
			var m string
			if dec.Decode(&m) != nil {
				return ""
			}
			return m
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return ""
		}
	}
	return ""
}
