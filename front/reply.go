// Package front holds what both fronts (the ext_proc server and the plain proxy) do the
// same way at the edge of a request: the HTTP answer kvroute gives itself for a request
// it refuses, in the request's API shape (ErrorReply).
package front

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/router"
)

// Reply is the HTTP answer a front (the ext_proc server or the plain proxy) gives for a
// request it refuses. Both fronts build it with ErrorReply so that a client sees the
// same status, headers and error JSON whichever front it talks to.
type Reply struct {
	Status int
	// Body is the error document in the request's API shape:
	//   - OpenAI paths (chat, completions, any other path):
	//     {"error":{"message":…,"type":…,"param":…,"code":Status}};
	//   - Anthropic /v1/messages:
	//     {"type":"error","error":{"type":…,"message":…}} (AnthropicErrorType).
	Body []byte
	// Header holds the response headers besides the framing ones: always
	// content-type: application/json, plus retry-after (whole seconds, rounded up; 1
	// when the error gives none) on 429 shed and 503 no healthy worker — health comes
	// back with the next /metrics scrape (scoring.scrape.interval, 1 s by default) —
	// and on any *router.Error with RetryAfter > 0; then the *router.Error's own Header.
	Header [][2]string
	// Details is a short machine-readable cause (no spaces) for logs and Envoy's
	// %RESPONSE_CODE_DETAILS%, e.g. "kvroute_unknown_model".
	Details string
}

// ErrUpstream marks a failure to reach or read the chosen worker (connect error,
// reset before response headers). Fronts wrap it; ErrorReply answers 502.
var ErrUpstream = errors.New("upstream worker unavailable")

// ErrorReply maps any error of a request's journey to its reply, in one place, for a
// request of the given API (request.APIForPath of its path; the shape of the body
// depends on it, the status does not):
//
//   - *request.Error (malformed body, 413 body too large): its 4xx and type;
//   - *router.Error (from Pick, or any other refusal: admission, authentication …): its
//     status, type (OpenAI; "" → by status) and Retry-After — 404 unknown model, 503
//     no healthy worker and 429 shed, both with Retry-After;
//   - ErrUpstream: 502 upstream_error, message "upstream worker unavailable" (the
//     wrapped cause is for logs: it names the backend's address);
//   - context.Canceled / DeadlineExceeded (the client or Envoy went away): 503;
//   - anything else: 500 internal_error.
//
// A status outside 400–599 becomes 500. On /v1/messages the body is Anthropic's
// error shape with AnthropicErrorType(status); elsewhere OpenAI's.
func ErrorReply(api request.API, err error) Reply {
	var (
		status          int
		typ, param, msg string
		details         string
		retryAfter      time.Duration
		extra           [][2]string
	)
	var rerr *router.Error
	if qe, ok := request.AsError(err); ok {
		status, typ, param, msg = qe.Status, qe.Type, qe.Param, qe.Message
		details = "kvroute_bad_request"
		if status == http.StatusRequestEntityTooLarge {
			details = "kvroute_body_too_large"
		}
	} else if errors.As(err, &rerr) {
		status, typ, msg, retryAfter, details = rerr.Status, rerr.Type, rerr.Message, rerr.RetryAfter, rerr.Details
		extra = rerr.Header
		if details == "" {
			switch status {
			case http.StatusNotFound:
				details = "kvroute_unknown_model"
			case http.StatusTooManyRequests:
				details = "kvroute_shed"
			case http.StatusServiceUnavailable:
				details = "kvroute_no_healthy_worker"
			default:
				details = "kvroute_refused_" + strconv.Itoa(status)
			}
		}
	} else if errors.Is(err, ErrUpstream) {
		// The cause (e.g. "dial tcp 10.0.0.7:8000: connection refused") names a backend
		// address: fronts log it; the client gets only the fixed message.
		status, typ, msg, details = http.StatusBadGateway, "upstream_error", ErrUpstream.Error(), "kvroute_upstream_error"
	} else if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		status, typ, msg, details = http.StatusServiceUnavailable, "service_unavailable", "request cancelled while routing", "kvroute_cancelled"
	} else {
		status, typ, msg, details = http.StatusInternalServerError, "internal_error", "internal routing error", "kvroute_internal_error"
	}
	if status < 400 || status > 599 {
		status, typ, details = http.StatusInternalServerError, "", "kvroute_internal_error"
	}
	if typ == "" {
		typ = openAIErrorType(status)
	}
	if msg == "" {
		msg = http.StatusText(status)
	}
	var body []byte
	if api == request.APIMessages {
		body = anthropicErrorJSON(AnthropicErrorType(status), msg)
	} else {
		body = request.ErrorJSON(status, typ, param, msg)
	}
	r := Reply{Status: status, Body: body, Details: details, Header: [][2]string{{"content-type", "application/json"}}}
	if status == http.StatusTooManyRequests || (status == http.StatusServiceUnavailable && details == "kvroute_no_healthy_worker") || retryAfter > 0 {
		if retryAfter <= 0 {
			retryAfter = time.Second
		}
		secs := int64((retryAfter + time.Second - 1) / time.Second)
		r.Header = append(r.Header, [2]string{"retry-after", strconv.FormatInt(secs, 10)})
	}
	r.Header = append(r.Header, extra...)
	return r
}

// AnthropicErrorType is the error.type Anthropic's Messages API documents for an HTTP
// status (https://docs.claude.com/en/api/errors): 400 invalid_request_error (also for
// other 4xx not listed), 401 authentication_error, 403 permission_error, 404
// not_found_error, 413 request_too_large, 429 rate_limit_error, 500 api_error.
// Anthropic answers overload with 529 overloaded_error; kvroute keeps HTTP's 503 for
// "no worker can take it now" and gives it overloaded_error, and any other 5xx (502
// upstream, 504) api_error.
func AnthropicErrorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable:
		return "overloaded_error"
	}
	if status >= 400 && status < 500 {
		return "invalid_request_error"
	}
	return "api_error"
}

// openAIErrorType is the OpenAI error type for a *router.Error that names none.
func openAIErrorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusBadGateway:
		return "upstream_error"
	case http.StatusServiceUnavailable:
		return "service_unavailable"
	}
	if status >= 400 && status < 500 {
		return "invalid_request_error"
	}
	return "internal_error"
}

// anthropicErrorJSON renders {"type":"error","error":{"type":typ,"message":msg}}.
func anthropicErrorJSON(typ, msg string) []byte {
	type detail struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	b, _ := json.Marshal(struct {
		Type  string `json:"type"`
		Error detail `json:"error"`
	}{"error", detail{typ, msg}})
	return b
}
