package router

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/request"
)

// Reply is the HTTP answer a front (the ext_proc server or the plain proxy) gives for a
// request it refuses. Both fronts build it with ErrorReply so that a client sees the
// same status, headers and OpenAI-style error JSON whichever front it talks to.
type Reply struct {
	Status int
	// Body is an OpenAI-style error document:
	// {"error":{"message":…,"type":…,"param":…,"code":Status}}.
	Body []byte
	// Header holds the response headers besides the framing ones: always
	// content-type: application/json, plus retry-after (whole seconds, rounded up) on 429.
	Header [][2]string
	// Details is a short machine-readable cause (no spaces) for logs and Envoy's
	// %RESPONSE_CODE_DETAILS%, e.g. "kvroute_unknown_model".
	Details string
}

// ErrUpstream marks a failure to reach or read the chosen worker (connect error,
// reset before response headers). Fronts wrap it; ErrorReply answers 502.
var ErrUpstream = errors.New("upstream worker unavailable")

// ErrorReply maps any error of a request's journey to its reply, in one place:
//
//   - *request.Error (malformed body, 413 body too large): its 4xx and type;
//   - *Error from Pick: 404 unknown model, 503 no healthy worker, 429 shed with Retry-After;
//   - ErrUpstream: 502 upstream_error;
//   - context.Canceled / DeadlineExceeded (the client or Envoy went away): 503;
//   - anything else: 500 internal_error.
func ErrorReply(err error) Reply {
	var (
		status          int
		typ, param, msg string
		details         string
		retryAfter      time.Duration
	)
	var rerr *Error
	if qe, ok := request.AsError(err); ok {
		status, typ, param, msg = qe.Status, qe.Type, qe.Param, qe.Message
		details = "kvroute_bad_request"
		if status == http.StatusRequestEntityTooLarge {
			details = "kvroute_body_too_large"
		}
	} else if errors.As(err, &rerr) {
		status, typ, msg, retryAfter = rerr.Status, rerr.Type, rerr.Message, rerr.RetryAfter
		switch status {
		case http.StatusNotFound:
			details = "kvroute_unknown_model"
		case http.StatusTooManyRequests:
			details = "kvroute_shed"
		default:
			details = "kvroute_no_healthy_worker"
		}
	} else if errors.Is(err, ErrUpstream) {
		status, typ, msg, details = http.StatusBadGateway, "upstream_error", "the chosen worker could not be reached: "+err.Error(), "kvroute_upstream_error"
	} else if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		status, typ, msg, details = http.StatusServiceUnavailable, "service_unavailable", "request cancelled while routing", "kvroute_cancelled"
	} else {
		status, typ, msg, details = http.StatusInternalServerError, "internal_error", "internal routing error", "kvroute_internal_error"
	}
	if status < 400 || status > 599 {
		status = http.StatusInternalServerError
	}
	r := Reply{Status: status, Body: request.ErrorJSON(status, typ, param, msg), Details: details,
		Header: [][2]string{{"content-type", "application/json"}}}
	if status == http.StatusTooManyRequests {
		if retryAfter <= 0 {
			retryAfter = time.Second
		}
		secs := int64((retryAfter + time.Second - 1) / time.Second)
		r.Header = append(r.Header, [2]string{"retry-after", strconv.FormatInt(secs, 10)})
	}
	return r
}
