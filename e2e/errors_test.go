package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/config"
)

// Every error kvroute answers itself on /v1/messages has Anthropic's shape, with the
// status Anthropic documents (503 stays 503), through both fronts; the same refusal on
// an OpenAI path keeps OpenAI's shape (front.ErrorReply).

func TestAnthropicErrors(t *testing.T) {
	for _, mode := range []Mode{Buffered, FullDuplex} {
		t.Run(mode.String(), func(t *testing.T) {
			anthropicErrorsThroughFront(t, fixtureOpts{envoy: Config{RequestBodyMode: mode, ResponseBodyMode: mode}})
		})
	}
}

func TestProxyAnthropicErrors(t *testing.T) {
	f := anthropicErrorsThroughFront(t, fixtureOpts{proxy: true})
	// 502: every worker down (the proxy's own answer; behind Envoy it is Envoy's).
	for _, w := range f.workers {
		f.app.Registry.SetHealthy(w.name, true)
		w.srv.Close()
	}
	st, h, body := f.do("POST", "/v1/messages", anthropicBody)
	checkAnthropicError(t, st, h, body, 502, "api_error")
	st, h, body = f.do("POST", "/v1/chat/completions", chatStream)
	checkOpenAIError(t, st, h, body, 502, "upstream_error")
}

const anthropicBody = `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`

func anthropicErrorsThroughFront(t *testing.T, opts fixtureOpts) *fixture {
	t.Helper()
	opts.cfg = func(c *config.Config) {
		c.ExtProc.MaxBodyBytes = 4096
		c.Scoring.Scrape.Interval = 0 // health is set by hand below; a scrape would restore it
	}
	f := newFixture(t, opts)
	st, h, body := f.do("POST", "/v1/messages", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"`+strings.Repeat("x", 5000)+`"}]}`)
	checkAnthropicError(t, st, h, body, 413, "request_too_large")
	st, h, body = f.do("POST", "/v1/messages", `{"model":"m","messages":[`)
	checkAnthropicError(t, st, h, body, 400, "invalid_request_error")
	st, h, body = f.do("POST", "/v1/messages", `{"model":"nope","max_tokens":8,"messages":[{"role":"user","content":"x"}]}`)
	checkAnthropicError(t, st, h, body, 404, "not_found_error")
	st, h, body = f.do("POST", "/v1/messages?beta=true", `{"model":"nope","max_tokens":8,"messages":[{"role":"user","content":"x"}]}`)
	checkAnthropicError(t, st, h, body, 404, "not_found_error")
	st, h, body = f.do("POST", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`)
	checkOpenAIError(t, st, h, body, 404, "NotFoundError")
	for _, w := range f.workers {
		f.app.Registry.SetHealthy(w.name, false)
	}
	st, h, body = f.do("POST", "/v1/messages", anthropicBody)
	checkAnthropicError(t, st, h, body, 503, "overloaded_error")
	if h.Get("Retry-After") != "1" {
		t.Fatalf("503 no healthy worker: retry-after %q, want 1", h.Get("Retry-After"))
	}
	st, h, body = f.do("POST", "/v1/chat/completions", chatStream)
	checkOpenAIError(t, st, h, body, 503, "service_unavailable")
	for _, w := range f.workers {
		if w.hits.Load() != 0 {
			t.Fatal("a refused request reached a worker")
		}
	}
	return f
}

// checkAnthropicError asserts Anthropic's error reply:
// {"type":"error","error":{"type":wantType,"message":…}}.
func checkAnthropicError(t *testing.T, status int, h http.Header, body string, wantStatus int, wantType string) {
	t.Helper()
	if status != wantStatus {
		t.Fatalf("status = %d, want %d (body %q)", status, wantStatus, body)
	}
	if ct := h.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content-type = %q, want application/json", ct)
	}
	var e struct {
		Type  string         `json:"type"`
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Type != "error" || e.Error["type"] != wantType ||
		e.Error["message"] == "" || e.Error["message"] == nil || len(e.Error) != 2 {
		t.Fatalf("body %q: want Anthropic's error shape with type %s: %v", body, wantType, err)
	}
}
