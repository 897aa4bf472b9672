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
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/internal/jsonvalue"
)

// API names the request shape a body was parsed as.
type API string

const (
	APIChat        API = "chat"        // POST /v1/chat/completions (OpenAI)
	APICompletions API = "completions" // POST /v1/completions (OpenAI)
	APIMessages    API = "messages"    // POST /v1/messages (Anthropic)
	APIOther       API = "other"       // any other path: passed through, load-only pick
)

// APIForPath maps a request path (query string ignored) to the API it carries. The
// match is exact, as vLLM's routes are: a trailing "/" (/v1/chat/completions/) is
// another path (APIOther) — vLLM's FastAPI answers it with a 307 redirect to the
// path without it (Starlette redirect_slashes), or 404 — so kvroute neither parses
// nor books it as an inference request.
func APIForPath(path string) API {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
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
// Messages, System, Tools and ChatTemplateKwargs keep the client's JSON as parsed once
// (jsonvalue.Value: key order kept, a repeated key last-wins, numbers as written) so that
// a chat template sees every field (tool_calls, reasoning, multi-part content) exactly as
// json.loads gives it to vLLM, with no second decode.
type Request struct {
	API   API
	Model string // "model" field; the served model name or a LoRA adapter name

	// Chat / messages APIs.
	System               jsonvalue.Value    // Anthropic top-level "system" (string or content blocks); null otherwise
	Messages             []jsonvalue.Value  // chat messages in order, each an object with a string "role"
	Tools                []jsonvalue.Value  // tool definitions (OpenAI or Anthropic form), as sent
	AddGenerationPrompt  *bool              // chat: add_generation_prompt (vLLM default true)
	ContinueFinalMessage bool               // chat: continue_final_message
	ChatTemplateKwargs   []jsonvalue.Member // chat: chat_template_kwargs, in the client's order
	ReasoningEffort      string             // chat: reasoning_effort

	// Completions API: exactly one of Prompts or PromptTokenIDs is set.
	Prompts          []string   // prompt as string or list of strings
	PromptTokenIDs   [][]uint32 // prompt as token ids or list of token-id lists
	AddSpecialTokens *bool      // completions/chat override of add_special_tokens

	Stream       bool // "stream": true → SSE response
	IncludeUsage bool // stream_options.include_usage
	// HasStreamOptions: the body names stream_options, whatever it holds (null too).
	HasStreamOptions bool
	// MaxTokens is the output token limit (max_completion_tokens, max_tokens); 0 when absent.
	MaxTokens int
	CacheSalt string // vLLM cache_salt: isolates the prefix cache namespace
}

// Kwarg returns chat_template_kwargs[key] and whether it was given.
func (r *Request) Kwarg(key string) (jsonvalue.Value, bool) {
	for i := range r.ChatTemplateKwargs {
		if r.ChatTemplateKwargs[i].Key == key {
			return r.ChatTemplateKwargs[i].Value, true
		}
	}
	return jsonvalue.Value{}, false
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

// Parse decodes body as the given API in one pass (jsonvalue.ParseValue: the Request's messages
// and tools share memory with body, which must not be modified afterwards), then reads the fields
// kvroute needs from the top-level object. Field names match exactly (case-sensitive,
// as vLLM's pydantic models do: "MODEL" is not "model"); a repeated field takes its last
// value, as json.loads does. Errors are *Error with a 4xx status.
// For APIOther it returns a Request with only Model filled when the body is a JSON
// object with a "model" string, and never fails.
func Parse(api API, body []byte) (*Request, error) {
	return ParseBounded(api, body, DefaultMaxArrayElements)
}

// DefaultMaxArrayElements is Parse's bound on the elements of any one array in a body
// (a token-id prompt, messages, a list of prompts): 2^20, above the longest context of
// served models (1 M tokens), so that no valid request is refused.
const DefaultMaxArrayElements = 1 << 20

// ParseBounded is Parse refusing a body with an array of more than maxElems elements
// (0 = DefaultMaxArrayElements) while it is parsed, before that array is built: a
// token-id prompt longer than the caller's bound (router.max_prompt_tokens, the
// longest models[].max_model_len) is a 400 that allocated at most maxElems elements,
// not a 7 M-element tree (~80 bytes per id) refused after the fact.
func ParseBounded(api API, body []byte, maxElems int) (*Request, error) {
	if maxElems <= 0 {
		maxElems = DefaultMaxArrayElements
	}
	if api == APIOther {
		r := &Request{API: APIOther}
		if len(body) > 0 {
			if v, err := jsonvalue.ParseValue(body); err == nil {
				if m, ok := v.Field("model").Str(); ok {
					r.Model = strings.Clone(m)
				}
			}
		}
		return r, nil
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, ErrEmptyBody
	}
	root, err := jsonvalue.ParseValueLimit(body, maxElems)
	if err != nil {
		var le *jsonvalue.LimitError
		if errors.As(err, &le) {
			return nil, invalid("", "request body has an array of more than %d elements (at byte %d): a prompt of token ids is at most the model's context length", le.Max, le.Offset)
		}
		var se *jsonvalue.SyntaxError
		if errors.As(err, &se) {
			return nil, invalid("", "request body is not valid JSON: %s (at byte %d)", se.Msg, se.Offset)
		}
		return nil, invalid("", "request body is not valid JSON")
	}
	if root.Kind() != jsonvalue.Object {
		return nil, invalid("", "request body must be a JSON object, got %s", root.Kind())
	}
	r := &Request{API: api}
	var (
		maxTokens, maxCompletion *int
		messages, prompt         jsonvalue.Value
	)
	for _, m := range root.Members() {
		v := m.Value
		switch m.Key {
		case "model":
			if err := wantString(m.Key, v, &r.Model); err != nil {
				return nil, err
			}
		case "messages":
			messages = v
		case "system":
			r.System = v
		case "tools":
			r.Tools = nil
			if v.IsNull() {
				continue
			}
			if v.Kind() != jsonvalue.Array {
				return nil, typeError(m.Key, "an array of objects", v)
			}
			for i := range v.Len() {
				if e := v.Index(i); e.Kind() != jsonvalue.Object && !e.IsNull() {
					return nil, elemError(m.Key, "an array of objects", e)
				}
			}
			r.Tools = elements(v)
		case "prompt":
			prompt = v
		case "stream":
			if err := wantBool(m.Key, v, &r.Stream); err != nil {
				return nil, err
			}
		case "stream_options":
			r.IncludeUsage, r.HasStreamOptions = false, true
			if v.IsNull() {
				continue
			}
			if v.Kind() != jsonvalue.Object {
				return nil, typeError(m.Key, "an object", v)
			}
			if err := wantBool("stream_options.include_usage", v.Field("include_usage"), &r.IncludeUsage); err != nil {
				return nil, err
			}
		case "max_tokens":
			if maxTokens, err = wantInt(m.Key, v); err != nil {
				return nil, err
			}
		case "max_completion_tokens":
			if maxCompletion, err = wantInt(m.Key, v); err != nil {
				return nil, err
			}
		case "add_generation_prompt":
			if r.AddGenerationPrompt, err = wantBoolPtr(m.Key, v); err != nil {
				return nil, err
			}
		case "continue_final_message":
			if err := wantBool(m.Key, v, &r.ContinueFinalMessage); err != nil {
				return nil, err
			}
		case "chat_template_kwargs":
			r.ChatTemplateKwargs = nil
			if v.IsNull() {
				continue
			}
			if v.Kind() != jsonvalue.Object {
				return nil, typeError(m.Key, "an object", v)
			}
			r.ChatTemplateKwargs = v.Members()
		case "reasoning_effort":
			if err := wantString(m.Key, v, &r.ReasoningEffort); err != nil {
				return nil, err
			}
		case "add_special_tokens":
			if r.AddSpecialTokens, err = wantBoolPtr(m.Key, v); err != nil {
				return nil, err
			}
		case "cache_salt":
			if err := wantString(m.Key, v, &r.CacheSalt); err != nil {
				return nil, err
			}
		}
	}
	// Routing scalars outlive the body (labels, tickets): copy them off it.
	r.Model, r.CacheSalt, r.ReasoningEffort = strings.Clone(r.Model), strings.Clone(r.CacheSalt), strings.Clone(r.ReasoningEffort)
	if r.Model == "" {
		return nil, invalid("model", "field 'model' is required")
	}
	switch {
	case maxCompletion != nil:
		r.MaxTokens = *maxCompletion
	case maxTokens != nil:
		r.MaxTokens = *maxTokens
	}
	if r.MaxTokens < 0 {
		return nil, invalid("max_tokens", "max_tokens must be ≥ 0, got %d", r.MaxTokens)
	}
	switch api {
	case APIChat, APIMessages:
		if !messages.IsNull() && messages.Kind() != jsonvalue.Array {
			return nil, typeError("messages", "an array of objects", messages)
		}
		if messages.Len() == 0 {
			return nil, invalid("messages", "field 'messages' must be a non-empty array")
		}
		for i := range messages.Len() {
			m := messages.Index(i)
			switch m.Kind() {
			case jsonvalue.Object:
			case jsonvalue.Null:
				return nil, invalid("messages", "messages[%d] must be an object", i)
			default:
				return nil, elemError("messages", "an array of objects", m)
			}
			if _, ok := m.Field("role").Str(); !ok {
				return nil, invalid("messages", "messages[%d].role must be a string", i)
			}
		}
		r.Messages = elements(messages)
		if api == APIMessages {
			if maxTokens == nil {
				return nil, invalid("max_tokens", "field 'max_tokens' is required for /v1/messages")
			}
		} else {
			r.System = jsonvalue.Value{}
		}
	case APICompletions:
		r.System = jsonvalue.Value{}
		if err := parsePrompt(prompt, r); err != nil {
			return nil, err
		}
	default:
		return nil, invalid("", "unsupported API %q", api)
	}
	return r, nil
}

// elements returns an array's elements as a slice of Values.
func elements(v jsonvalue.Value) []jsonvalue.Value {
	out := make([]jsonvalue.Value, v.Len())
	for i := range out {
		out[i] = v.Index(i)
	}
	return out
}

// got names a JSON value's type as encoding/json's type errors did: "string",
// "number 1.5", "bool", "array", "object".
func got(v jsonvalue.Value) string {
	if v.Kind() == jsonvalue.Number {
		if v.IsInt() {
			return "number"
		}
		return "number " + v.Text()
	}
	return v.Kind().String()
}

func typeError(field, want string, v jsonvalue.Value) *Error {
	return invalid(field, "field '%s' must be %s, got %s", field, want, got(v))
}

func elemError(field, want string, v jsonvalue.Value) *Error {
	return invalid(field, "field '%s' must be %s, got an element of type %s", field, want, v.Kind())
}

// null leaves every field at its zero value, as encoding/json did.

func wantString(field string, v jsonvalue.Value, dst *string) error {
	switch v.Kind() {
	case jsonvalue.Null:
		*dst = ""
	case jsonvalue.String:
		*dst = v.Text()
	default:
		return typeError(field, "a string", v)
	}
	return nil
}

func wantBool(field string, v jsonvalue.Value, dst *bool) error {
	switch v.Kind() {
	case jsonvalue.Null:
		*dst = false
	case jsonvalue.Bool:
		*dst = v.Boolean()
	default:
		return typeError(field, "a boolean", v)
	}
	return nil
}

func wantBoolPtr(field string, v jsonvalue.Value) (*bool, error) {
	if v.IsNull() {
		return nil, nil
	}
	var b bool
	if err := wantBool(field, v, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

func wantInt(field string, v jsonvalue.Value) (*int, error) {
	if v.IsNull() {
		return nil, nil
	}
	n, ok := v.Int()
	if !ok || int64(int(n)) != n {
		return nil, typeError(field, "an integer", v)
	}
	i := int(n)
	return &i, nil
}

// parsePrompt accepts a string, a list of strings, a list of token ids, or a list of
// token-id lists, as vLLM's /v1/completions does.
func parsePrompt(v jsonvalue.Value, r *Request) error {
	bad := invalid("prompt", "field 'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists")
	switch v.Kind() {
	case jsonvalue.Null:
		return invalid("prompt", "field 'prompt' is required")
	case jsonvalue.String:
		r.Prompts = []string{v.Text()}
		return nil
	case jsonvalue.Array:
	default:
		return bad
	}
	if v.Len() == 0 {
		return bad
	}
	switch v.Index(0).Kind() {
	case jsonvalue.String:
		ss := make([]string, v.Len())
		for i := range ss {
			s, ok := v.Index(i).Str()
			if !ok {
				return bad
			}
			ss[i] = s
		}
		r.Prompts = ss
		return nil
	case jsonvalue.Number:
		ids, ok := tokenIDs(v)
		if !ok {
			return bad
		}
		r.PromptTokenIDs = [][]uint32{ids}
		return nil
	case jsonvalue.Array:
		idss := make([][]uint32, v.Len())
		for i := range idss {
			e := v.Index(i)
			if e.Kind() != jsonvalue.Array {
				return bad
			}
			ids, ok := tokenIDs(e)
			if !ok {
				return bad
			}
			if len(ids) == 0 {
				return invalid("prompt", "prompt[%d] is an empty token list", i)
			}
			idss[i] = ids
		}
		r.PromptTokenIDs = idss
		return nil
	}
	return bad
}

// tokenIDs reads an array of non-negative 32-bit integers. An array the parser stored
// packed (every element a plain integer that fits uint32) is used as it is, shared with
// the parsed body's Value: no Value per id, 4 bytes per id in all.
func tokenIDs(v jsonvalue.Value) ([]uint32, bool) {
	if ids, ok := v.Uint32s(); ok {
		return ids, true
	}
	ids := make([]uint32, v.Len())
	for i := range ids {
		e := v.Index(i)
		if e.Kind() != jsonvalue.Number || !e.IsInt() {
			return nil, false
		}
		n, err := strconv.ParseUint(e.Text(), 10, 32)
		if err != nil {
			return nil, false
		}
		ids[i] = uint32(n)
	}
	return ids, true
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
// truncated (a BUFFERED_PARTIAL body cut at Envoy's buffer limit), with the rule a full
// parse applies: names match exactly and a repeated "model" takes its last value. sure
// is true when the whole object was read, so no later "model" can follow. A model
// value that is itself cut, or that a later cut "model" key overrides, gives "", false.
// It returns "" when the body is not a JSON object or the field is absent or not a string.
func SniffModel(body []byte) (model string, sure bool) {
	return jsonvalue.SniffString(body, "model")
}
