package e2e

import (
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
)

// SLO admission through both fronts and both API shapes: a class whose objective no
// worker can meet (1 ms; an idle worker's prediction holds at least the 20 ms prior
// overhead) with on_slo_miss: refuse is answered by kvroute itself — 429, Retry-After,
// x-kvroute-rejected-reason: slo_miss, x-kvroute-class — in OpenAI's error shape on
// /v1/chat/completions and Anthropic's on /v1/messages, and no worker sees the request.
// Behind Envoy (the stand-in) the reply is ext_proc's ImmediateResponse, which Envoy
// sends downstream as is, headers included (envoy ext_proc filter,
// "immediate_response"). A class with on_slo_miss unset is routed as before.
func TestSLORefusalBothFronts(t *testing.T) {
	for _, proxy := range []bool{false, true} {
		t.Run(map[bool]string{false: "ext_proc", true: "proxy"}[proxy], func(t *testing.T) {
			f := newFixture(t, fixtureOpts{proxy: proxy, cfg: func(c *config.Config) {
				c.Admission.TenantHeader = ""
				c.Admission.Classes = []config.Class{
					{Name: "strict", TTFTObjective: time.Millisecond, OnSLOMiss: config.SLOMissRefuse,
						Match: config.ClassMatch{Headers: map[string]string{"x-test-class": "strict"}}},
				}
			}})
			chat := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
			st, h, body := f.do("POST", "/v1/chat/completions", chat, "x-test-class", "strict")
			checkOpenAIError(t, st, h, body, 429, "rate_limit_error")
			checkSLORefusalHeaders(t, h)
			msg := `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`
			st, h, body = f.do("POST", "/v1/messages", msg, "anthropic-version", "2023-06-01", "x-test-class", "strict")
			checkAnthropicError(t, st, h, body, 429, "rate_limit_error")
			checkSLORefusalHeaders(t, h)
			for _, w := range f.workers {
				if n := w.hits.Load(); n != 0 {
					t.Fatalf("worker %s saw %d requests; a refused request reaches none", w.name, n)
				}
			}
			// without the header the request is of the default class, admitted as before
			st, _, body = f.do("POST", "/v1/chat/completions", chat)
			if st != 200 {
				t.Fatalf("default class: %d %s", st, body)
			}
		})
	}
}

func checkSLORefusalHeaders(t *testing.T, h map[string][]string) {
	t.Helper()
	get := func(k string) string {
		if v := h[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	if get("X-Kvroute-Rejected-Reason") != "slo_miss" || get("X-Kvroute-Class") != "strict" {
		t.Fatalf("headers %v: want x-kvroute-rejected-reason slo_miss, x-kvroute-class strict", h)
	}
	ra, err := strconv.Atoi(get("Retry-After"))
	if err != nil || ra < 1 || ra > 30 {
		t.Fatalf("Retry-After %q: want whole seconds in [1, scoring.retry_after_max = 30]", get("Retry-After"))
	}
}
