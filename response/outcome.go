package response

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
)

// Outcome is how one routed request ended. It is the `outcome` label of both fronts'
// request counters (kvroute_extproc_requests_total, kvroute_proxy_requests_total) and
// decides what the router learns from the request: TTFT only from requests that
// produced a first token (whatever their outcome), E2E only from OutcomeOK. The set is
// closed (bounded label cardinality).
type Outcome string

const (
	// OutcomeOK: a 2xx (or other non-error) response that ended the way a good
	// completion ends: a finish reason (OpenAI choices[].finish_reason, Anthropic
	// stop_reason) and no error event. A path that is not an inference API is OK on
	// status alone.
	OutcomeOK Outcome = "ok"
	// OutcomeClientError: a 4xx from the worker (the request's fault).
	OutcomeClientError Outcome = "client_error"
	// OutcomeUpstreamError: a 5xx from the worker, or a failure to reach or read it.
	OutcomeUpstreamError Outcome = "upstream_error"
	// OutcomeErrorEvent: a 2xx whose body carried an error: an SSE event with a
	// top-level "error" (vLLM's streaming error), Anthropic's `event: error`
	// ({"type":"error",…}), a non-streamed JSON error document, or finish_reason "error".
	OutcomeErrorEvent Outcome = "error_event"
	// OutcomeTruncated: a 2xx inference response that ended without a finish reason:
	// a stream carrying only `data: [DONE]`, or one that stops before its end.
	OutcomeTruncated Outcome = "truncated"
	// OutcomeAborted: the request was cut off before its response ended (client gone,
	// Envoy reset or closed the ext_proc stream, the worker removed), or the engine
	// reported finish_reason "abort".
	OutcomeAborted Outcome = "aborted"
	// OutcomeExpired: the ticket was still open after the router's TicketTTL and was
	// released by the sweep (the end of its response was never seen).
	OutcomeExpired Outcome = "expired"
	// OutcomeRejected is not a ticket outcome: kvroute answered the request itself
	// (400, 404, 413, 429, 503, 502 …, front.ErrorReply) and routed nothing. It
	// appears only on the fronts' request counters.
	OutcomeRejected Outcome = "rejected"
)

// Outcomes lists every value of the outcome label, in documentation order.
var Outcomes = []Outcome{OutcomeOK, OutcomeClientError, OutcomeUpstreamError, OutcomeErrorEvent,
	OutcomeTruncated, OutcomeAborted, OutcomeExpired, OutcomeRejected}

// Result is what a front hands the router when a response ended.
type Result struct {
	Status  int // upstream HTTP status; 0 unknown
	Usage   Usage
	Outcome Outcome
}

// StatusOutcome classifies a response on its status alone (a front that does not see
// the body): ≥ 500 upstream_error, ≥ 400 client_error, anything else ok.
func StatusOutcome(status int) Outcome {
	switch {
	case status >= http.StatusInternalServerError:
		return OutcomeUpstreamError
	case status >= http.StatusBadRequest:
		return OutcomeClientError
	}
	return OutcomeOK
}

// Result ends the body (Finish) and classifies the response from its status and what
// the body showed. inference is true for the inference APIs (chat, completions,
// messages), whose 2xx bodies must end with a finish reason to be OK; other paths are
// classified on status alone. A non-streamed body larger than the tracker's bound
// cannot be judged and is OK on status.
func (t *Tracker) Result(status int, inference bool) Result {
	u := t.Finish()
	return Result{Status: status, Usage: u, Outcome: t.outcome(status, inference)}
}

func (t *Tracker) outcome(status int, inference bool) Outcome {
	if o := StatusOutcome(status); o != OutcomeOK || !inference {
		return o
	}
	b := &t.body
	switch {
	case b.errored || b.reason == "error":
		return OutcomeErrorEvent
	case b.reason == "abort":
		return OutcomeAborted
	case b.finished:
		return OutcomeOK
	case !t.stream && t.overflow:
		return OutcomeOK
	}
	return OutcomeTruncated
}

// StreamBody reports whether a response body is SSE, for NewTracker: by its
// content-type when that names SSE (text/event-stream) or JSON (application/json —
// a worker answers a streaming request's error as one JSON document), else as the
// request asked (stream).
func StreamBody(contentType string, requested bool) bool {
	switch {
	case strings.HasPrefix(contentType, "text/event-stream"):
		return true
	case strings.HasPrefix(contentType, "application/json"):
		return false
	}
	return requested
}

// Ended reports whether an SSE stream's end marker went by: `data: [DONE]` (OpenAI,
// vLLM) or Anthropic's message_stop event. Nothing after it changes the result, so a
// front may complete the request there without waiting for the connection's end.
func (t *Tracker) Ended() bool { return t.body.ended }

// bodyState is what a response body said about how it ended.
type bodyState struct {
	ended    bool   // SSE end marker seen ([DONE], message_stop)
	finished bool   // a non-null finish reason was reported
	reason   string // the last finish reason (finish_reason, stop_reason)
	errored  bool   // an error event or error document
}

// endDoc is the part of an SSE event or JSON document that says how a response ends.
type endDoc struct {
	Object  string          `json:"object"` // "error": vLLM's older ErrorResponse
	Type    string          `json:"type"`   // Anthropic: "error", "message_stop", "message"
	Error   json.RawMessage `json:"error"`
	Choices []struct {
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	StopReason *string `json:"stop_reason"` // Anthropic non-streamed message
	Delta      *struct {
		StopReason *string `json:"stop_reason"` // Anthropic message_delta
	} `json:"delta"`
}

var doneMarker = []byte("[DONE]")

// event reads one SSE data payload. Only payloads that may end the response (a
// non-null finish or stop reason, an error document) are decoded: vLLM sends
// "finish_reason":null in every chunk, so a byte scan (mayEnd) decides before json
// does. Anthropic's message_stop and error events are also named on their `event:`
// line (eventLine).
func (b *bodyState) event(payload []byte) {
	if mayEnd(payload) {
		b.apply(payload)
	}
}

var needleReason = []byte(`_reason"`) // finish_reason, stop_reason

// mayEnd is a pre-filter over a JSON payload: it reports whether the payload starts
// as an error document does (its first key "error" — vLLM's and OpenAI's streaming
// error {"error":{…}} —, or a first "type"/"object" key whose value is "error"), or
// has a key ending in _reason (finish_reason, stop_reason) followed by ':' and a value
// other than null. The decoder confirms. One SIMD scan per event on top of the usage
// check: scanning for "error" anywhere too doubled the cost of tracking a stream
// (BenchmarkTrackerStream), and the engines put it first.
func mayEnd(p []byte) bool {
	if errorFirst(p) {
		return true
	}
	for {
		i := bytes.Index(p, needleReason)
		if i < 0 {
			return false
		}
		p = trimJSONSpace(p[i+len(needleReason):])
		if len(p) > 0 && p[0] == ':' {
			if v := trimJSONSpace(p[1:]); len(v) > 0 && v[0] != 'n' {
				return true
			}
		}
	}
}

var (
	keyError  = []byte(`"error"`)
	keyType   = []byte(`"type"`)
	keyObject = []byte(`"object"`)
)

// errorFirst reports whether the JSON object p opens with an "error" key, or with a
// "type" or "object" key whose value is "error".
func errorFirst(p []byte) bool {
	if len(p) == 0 || p[0] != '{' {
		return false
	}
	p = trimJSONSpace(p[1:])
	if bytes.HasPrefix(p, keyError) {
		return true
	}
	for _, k := range [][]byte{keyType, keyObject} {
		if bytes.HasPrefix(p, k) {
			v := trimJSONSpace(p[len(k):])
			return len(v) > 0 && v[0] == ':' && bytes.HasPrefix(trimJSONSpace(v[1:]), keyError)
		}
	}
	return false
}

func trimJSONSpace(p []byte) []byte {
	for len(p) > 0 && (p[0] == ' ' || p[0] == '\t' || p[0] == '\r' || p[0] == '\n') {
		p = p[1:]
	}
	return p
}

var (
	eventPrefix      = []byte("event:")
	eventMessageStop = []byte("message_stop")
	eventError       = []byte("error")
)

// eventLine reads an SSE `event:` line (Anthropic names every event there):
// message_stop ends the stream, error is an error event.
func (b *bodyState) eventLine(name []byte) {
	switch {
	case bytes.Equal(name, eventMessageStop):
		b.ended = true
	case bytes.Equal(name, eventError):
		b.errored = true
	}
}

// document reads a whole non-streamed JSON body.
func (b *bodyState) document(doc []byte) { b.apply(doc) }

func (b *bodyState) apply(doc []byte) {
	var d endDoc
	if json.Unmarshal(doc, &d) != nil {
		return
	}
	if d.Object == "error" || d.Type == "error" || (len(d.Error) > 0 && !bytes.Equal(d.Error, []byte("null"))) {
		b.errored = true
	}
	if d.Type == "message_stop" {
		b.ended = true
	}
	reason := func(r *string) {
		if r != nil {
			b.finished, b.reason = true, *r
		}
	}
	for _, c := range d.Choices {
		reason(c.FinishReason)
	}
	reason(d.StopReason)
	if d.Delta != nil {
		reason(d.Delta.StopReason)
	}
}
