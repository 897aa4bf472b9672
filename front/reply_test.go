package front

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/router"
)

// Every error kvroute answers itself has its API's shape: Anthropic's on /v1/messages
// (with the type Anthropic documents for the status; 503 stays 503), OpenAI's on every
// other path; the status and headers do not depend on the API.
func TestErrorReplyPerAPI(t *testing.T) {
	cases := []struct {
		err       error
		status    int
		openai    string // OpenAI error.type
		anthropic string // Anthropic error.type
	}{
		{&request.Error{Status: 400, Type: "invalid_request_error", Message: "bad"}, 400, "invalid_request_error", "invalid_request_error"},
		{request.TooLarge(10), 413, "invalid_request_error", "request_too_large"},
		{&router.Error{Status: 404, Type: "NotFoundError", Message: "The model `x` does not exist."}, 404, "NotFoundError", "not_found_error"},
		{&router.Error{Status: 429, Type: "rate_limit_error", Message: "shed"}, 429, "rate_limit_error", "rate_limit_error"},
		{&router.Error{Status: 503, Type: "service_unavailable", Message: "no healthy worker"}, 503, "service_unavailable", "overloaded_error"},
		{fmt.Errorf("%w: dial tcp 127.0.0.1:1: refused", ErrUpstream), 502, "upstream_error", "api_error"},
		{context.Canceled, 503, "service_unavailable", "overloaded_error"},
		{errors.New("boom"), 500, "internal_error", "api_error"},
		// Refusals other areas add (authentication, admission) need only a status.
		{&router.Error{Status: 401, Message: "missing API key"}, 401, "authentication_error", "authentication_error"},
		{&router.Error{Status: 403, Message: "tenant may not use this model"}, 403, "permission_error", "permission_error"},
		{&router.Error{Status: 429, Message: "tenant over its rate"}, 429, "rate_limit_error", "rate_limit_error"},
		{&router.Error{Status: 422, Message: "unprocessable"}, 422, "invalid_request_error", "invalid_request_error"},
		{&router.Error{Status: 504, Message: "timed out"}, 504, "internal_error", "api_error"},
	}
	for _, c := range cases {
		var oai Reply
		for _, api := range []request.API{request.APIChat, request.APICompletions, request.APIOther, request.APIMessages} {
			r := ErrorReply(api, c.err)
			if r.Status != c.status {
				t.Errorf("%v on %s: status %d, want %d", c.err, api, r.Status, c.status)
			}
			if api != request.APIMessages {
				var e struct {
					Error struct {
						Message, Type string
						Code          int
					}
				}
				if json.Unmarshal(r.Body, &e) != nil || e.Error.Type != c.openai || e.Error.Code != c.status || e.Error.Message == "" {
					t.Errorf("%v on %s: body %s, want an OpenAI error of type %s", c.err, api, r.Body, c.openai)
				}
				oai = r
				continue
			}
			var a struct {
				Type  string
				Error map[string]any
			}
			if json.Unmarshal(r.Body, &a) != nil || a.Type != "error" || a.Error["type"] != c.anthropic || a.Error["message"] == "" || len(a.Error) != 2 {
				t.Errorf("%v on /v1/messages: body %s, want Anthropic's {\"type\":\"error\",\"error\":{\"type\":%q,\"message\":…}}", c.err, r.Body, c.anthropic)
			}
			if fmt.Sprint(r.Header) != fmt.Sprint(oai.Header) || r.Details != oai.Details {
				t.Errorf("%v: headers/details differ by API: %v %s vs %v %s", c.err, r.Header, r.Details, oai.Header, oai.Details)
			}
		}
	}
}

// The Anthropic body keeps Anthropic's key order (type first) and escapes the message.
func TestAnthropicErrorBody(t *testing.T) {
	r := ErrorReply(request.APIMessages, &router.Error{Status: 404, Message: `no "m"`})
	if want := `{"type":"error","error":{"type":"not_found_error","message":"no \"m\""}}`; string(r.Body) != want {
		t.Fatalf("body %s, want %s", r.Body, want)
	}
}

// ErrorReply is the one mapping both fronts use.
func TestErrorReply(t *testing.T) {
	cases := []struct {
		err     error
		status  int
		retry   string
		details string
	}{
		{&request.Error{Status: 400, Type: "invalid_request_error", Message: "bad"}, 400, "", "kvroute_bad_request"},
		{request.TooLarge(10), 413, "", "kvroute_body_too_large"},
		{fmt.Errorf("wrapped: %w", &router.Error{Status: 404, Type: "NotFoundError", Message: "no"}), 404, "", "kvroute_unknown_model"},
		{&router.Error{Status: 503, Type: "service_unavailable", Message: "none"}, 503, "1", "kvroute_no_healthy_worker"},
		{&router.Error{Status: 429, Type: "rate_limit_error", Message: "shed", RetryAfter: 2100 * time.Millisecond}, 429, "3", "kvroute_shed"},
		{&router.Error{Status: 429, Type: "rate_limit_error", Message: "shed"}, 429, "1", "kvroute_shed"},
		{fmt.Errorf("%w: dial tcp 127.0.0.1:8009: connect: connection refused", ErrUpstream), 502, "", "kvroute_upstream_error"},
		{context.Canceled, 503, "", "kvroute_cancelled"},
		{errors.New("boom"), 500, "", "kvroute_internal_error"},
		{&router.Error{Status: 200, Message: "odd"}, 500, "", "kvroute_internal_error"},
	}
	for _, c := range cases {
		r := ErrorReply(request.APIChat, c.err)
		if r.Status != c.status || r.Details != c.details {
			t.Errorf("%v: %d %s, want %d %s", c.err, r.Status, r.Details, c.status, c.details)
		}
		hdr := map[string]string{}
		for _, kv := range r.Header {
			hdr[kv[0]] = kv[1]
		}
		if hdr["content-type"] != "application/json" || hdr["retry-after"] != c.retry {
			t.Errorf("%v: headers %v", c.err, r.Header)
		}
		if c.status == 502 && (strings.Contains(string(r.Body), "dial") || !strings.Contains(string(r.Body), `"upstream worker unavailable"`)) {
			t.Errorf("%v: 502 body %q must say only \"upstream worker unavailable\"", c.err, r.Body)
		}
		if len(r.Body) == 0 || r.Body[0] != '{' {
			t.Errorf("%v: body %q", c.err, r.Body)
		}
	}
}
