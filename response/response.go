// Package response watches an inference response body as it streams past (SSE or a
// single JSON document) and reports the moment generated content first appears and the
// usage the engine reported. It is shared by the ext_proc path and the plain proxy so
// that both learn from responses identically.
package response

import (
	"bytes"
	"encoding/json"
)

// Usage is what the engine reported about a finished request. Token counts are in tokens.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens (vLLM reports it with
	// --enable-prompt-tokens-details and omits it when zero) or Anthropic's
	// usage.cache_read_input_tokens. Meaningful only when CachedReported.
	CachedTokens int
	// CachedReported is true when the engine reported a cached-token count (a number,
	// 0 included); false when the field was absent or null. Absent is not evidence
	// that nothing was cached (vLLM omits prompt_tokens_details without
	// --enable-prompt-tokens-details, and when the count is 0).
	CachedReported bool
	Present        bool // a usage object was seen
}

// CachedReport names how a finished request's usage reported cached tokens, for the
// kvroute_router_usage_reports_total{kind} metric: "reported" (a number, 0 included),
// "absent" (usage without a cached-token count, or null), "no_usage" (no usage object).
func (u Usage) CachedReport() string {
	switch {
	case u.CachedReported:
		return "reported"
	case u.Present:
		return "absent"
	}
	return "no_usage"
}

// Tracker consumes body chunks in order. It is not safe for concurrent use.
//
// For SSE (stream=true) it parses "data:" events, robust to events split across chunks
// (Envoy does not align body chunks to event boundaries: envoyproxy/envoy#45437).
// The first event carrying generated content (a non-empty delta content, reasoning,
// tool call or completion text; Anthropic content_block_delta) is the first token.
// For a non-streamed JSON body the first token cannot be observed separately from the
// end of the response; FirstToken is never reported and usage is read at Finish.
type Tracker struct {
	stream   bool
	first    bool
	pending  []byte // unterminated SSE line, or the whole JSON body when !stream
	skipLine bool   // a runaway SSE line was dropped: discard through its newline
	usage    Usage
	maxBody  int
	overflow bool
	body     bodyState // what the body said about how it ended (outcome.go)
	count    bool      // CountContent: count every content event, not only the first
	events   int       // content events seen (when count)
}

// CountContent makes the tracker count every SSE event that carries generated content
// (ContentEvents), not only detect the first: admission settles a stream without a
// usage report on that count. It costs one JSON decode per event, so it is off unless
// asked for.
func (t *Tracker) CountContent() { t.count = true }

// Counting reports whether CountContent was called on a streamed (SSE) body.
func (t *Tracker) Counting() bool { return t.count && t.stream }

// ContentEvents is the number of SSE events with generated content seen so far (with
// CountContent). vLLM streams one event per decode step, one token each without
// speculative decoding, so it approximates the generated tokens from below.
func (t *Tracker) ContentEvents() int { return t.events }

// NewTracker returns a tracker for a response that is SSE when stream is true.
// maxBody bounds the bytes kept for a non-streamed body (usage parsing); 0 means 4 MiB.
func NewTracker(stream bool, maxBody int) *Tracker {
	if maxBody <= 0 {
		maxBody = 4 << 20
	}
	return &Tracker{stream: stream, maxBody: maxBody}
}

// Write feeds one body chunk. It reports true exactly once: on the chunk in which the
// first generated content appears.
func (t *Tracker) Write(chunk []byte) (firstToken bool) {
	if !t.stream {
		if !t.overflow {
			if len(t.pending)+len(chunk) > t.maxBody {
				t.overflow, t.pending = true, nil
			} else {
				t.pending = append(t.pending, chunk...)
			}
		}
		return false
	}
	data := chunk
	if t.skipLine {
		// The rest of a runaway line: skipped whole, so that the result does not
		// depend on where the chunks were cut.
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			return false
		}
		t.skipLine, data = false, data[i+1:]
	}
	if len(t.pending) > 0 {
		t.pending = append(t.pending, data...)
		data = t.pending
	}
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		line := bytes.TrimRight(data[:i], "\r")
		long := i > t.maxBody
		data = data[i+1:]
		if long {
			continue // as a runaway line: dropped whichever way the chunks were cut
		}
		if t.line(line) && !t.first {
			t.first, firstToken = true, true
		}
	}
	if len(data) > t.maxBody {
		// A runaway line without newline: drop it (through its newline) rather than
		// grow without bound.
		data, t.skipLine = nil, true
	}
	t.pending = append(t.pending[:0], data...)
	return firstToken
}

// FirstTokenSeen reports whether Write has reported the first token.
func (t *Tracker) FirstTokenSeen() bool { return t.first }

// Finish ends the body and returns the usage seen, if any.
func (t *Tracker) Finish() Usage {
	if !t.stream {
		if !t.overflow && len(t.pending) > 0 {
			t.usage = parseUsage(t.pending, t.usage)
			t.body.document(t.pending)
		}
		t.pending = nil
		return t.usage
	}
	if len(t.pending) > 0 && !t.skipLine {
		if t.line(bytes.TrimRight(t.pending, "\r")) && !t.first {
			t.first = true
		}
		t.pending = nil
	}
	return t.usage
}

var dataPrefix = []byte("data:")

// line handles one SSE line and reports whether it carried generated content.
func (t *Tracker) line(line []byte) bool {
	if !bytes.HasPrefix(line, dataPrefix) {
		if bytes.HasPrefix(line, eventPrefix) {
			t.body.eventLine(bytes.TrimSpace(line[len(eventPrefix):]))
		}
		return false
	}
	payload := bytes.TrimSpace(line[len(dataPrefix):])
	if len(payload) == 0 || payload[0] != '{' {
		if bytes.Equal(payload, doneMarker) {
			t.body.ended = true
		}
		return false // "[DONE]" or keep-alive
	}
	t.body.event(payload)
	content := false
	if !t.first || t.count {
		content = hasContent(payload)
		if content && t.count {
			t.events++
		}
	}
	if bytes.Contains(payload, []byte(`"usage"`)) {
		t.usage = parseUsage(payload, t.usage)
	}
	return content
}

type sseChunk struct {
	Choices []struct {
		Text  *string `json:"text"`
		Delta *struct {
			Content          *string           `json:"content"`
			ReasoningContent *string           `json:"reasoning_content"`
			Reasoning        *string           `json:"reasoning"`
			ToolCalls        []json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
	} `json:"choices"`
	Type  string `json:"type"` // Anthropic event type
	Delta *struct {
		Text        *string `json:"text"`
		Thinking    *string `json:"thinking"`
		PartialJSON *string `json:"partial_json"`
	} `json:"delta"`
}

func nonEmpty(s *string) bool { return s != nil && *s != "" }

func hasContent(payload []byte) bool {
	var c sseChunk
	if json.Unmarshal(payload, &c) != nil {
		return false
	}
	for _, ch := range c.Choices {
		if nonEmpty(ch.Text) {
			return true
		}
		if d := ch.Delta; d != nil && (nonEmpty(d.Content) || nonEmpty(d.ReasoningContent) || nonEmpty(d.Reasoning) || len(d.ToolCalls) > 0) {
			return true
		}
	}
	if c.Type == "content_block_delta" && c.Delta != nil {
		return nonEmpty(c.Delta.Text) || nonEmpty(c.Delta.Thinking) || nonEmpty(c.Delta.PartialJSON)
	}
	return false
}

type usageDoc struct {
	Usage *struct {
		PromptTokens        *int `json:"prompt_tokens"`
		CompletionTokens    *int `json:"completion_tokens"`
		InputTokens         *int `json:"input_tokens"`
		OutputTokens        *int `json:"output_tokens"`
		CacheReadInputToken *int `json:"cache_read_input_tokens"`
		PromptTokensDetails *struct {
			CachedTokens *int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Message *struct { // Anthropic message_start carries usage inside "message"
		Usage json.RawMessage `json:"usage"`
	} `json:"message"`
}

// parseUsage merges the usage found in doc into u (later reports win per field).
func parseUsage(doc []byte, u Usage) Usage {
	var d usageDoc
	if json.Unmarshal(doc, &d) != nil {
		return u
	}
	if d.Usage == nil && d.Message != nil && len(d.Message.Usage) > 0 {
		return parseUsage(append(append([]byte(`{"usage":`), d.Message.Usage...), '}'), u)
	}
	x := d.Usage
	if x == nil {
		return u
	}
	u.Present = true
	set := func(dst *int, v *int) {
		if v != nil {
			*dst = *v
		}
	}
	set(&u.PromptTokens, x.PromptTokens)
	set(&u.PromptTokens, x.InputTokens)
	set(&u.CompletionTokens, x.CompletionTokens)
	set(&u.CompletionTokens, x.OutputTokens)
	set(&u.CachedTokens, x.CacheReadInputToken)
	u.CachedReported = u.CachedReported || x.CacheReadInputToken != nil
	if x.PromptTokensDetails != nil {
		set(&u.CachedTokens, x.PromptTokensDetails.CachedTokens)
		u.CachedReported = u.CachedReported || x.PromptTokensDetails.CachedTokens != nil
	}
	return u
}
