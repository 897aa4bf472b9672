package extproc

import (
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/config"
)

// midMinute is a fixed clock in the middle of a minute: no budget window ends during a
// test, whatever the machine's speed.
func midMinute() time.Time { return time.Date(2026, 1, 1, 12, 0, 30, 0, time.UTC) }

func withAdmission(t *testing.T, h *harness, mod func(*config.Admission)) *admission.Admitter {
	t.Helper()
	c := config.Default().Admission
	mod(&c)
	a, err := admission.New(admission.Options{Config: c, Metrics: h.ms, Now: midMinute})
	if err != nil {
		t.Fatal(err)
	}
	h.srv.opt.Admission = a
	return a
}

// jwtMD is Envoy's metadata_context when jwt_authn (payload_in_metadata: jwt_payload)
// verified a token and the ext_proc filter forwards its namespace.
func jwtMD(t *testing.T, sub string) *corev3.Metadata {
	t.Helper()
	st, err := structpb.NewStruct(map[string]any{"jwt_payload": map[string]any{"sub": sub, "iss": "https://issuer"}})
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.filters.http.jwt_authn": st}}
}

func state(a *admission.Admitter, tenant string) admission.TenantState {
	for _, s := range a.Snapshot() {
		if s.Tenant == tenant {
			return s
		}
	}
	return admission.TenantState{}
}

// Through the ext_proc server: the verified claim in metadata_context wins over the
// tenant header; with the claim as the only source, a forged claim header is ignored;
// the request settles from the usage in the stream, once.
func TestExtProcMetadataTenantWinsAndSettles(t *testing.T) {
	h := newHarness(t)
	a := withAdmission(t, h, func(c *config.Admission) { c.Identity = []string{"metadata", "header"} })
	s := h.open(t)
	r := withPC(hdrs(false, post("/v1/chat/completions", "x-kvroute-tenant", "edge-team")...), modeBuffered, modeStreamed)
	r.MetadataContext = jwtMD(t, "jwt-team")
	s.send(r)
	s.recv()
	s.send(body(chatBody, true))
	if destOf(t, s.recv().GetRequestBody().GetResponse().GetHeaderMutation(), dest) == "" {
		t.Fatal("no destination")
	}
	if st := state(a, "jwt-team"); st.Concurrent != 1 || st.WindowRequests != 1 {
		t.Fatalf("reservation for the claim's tenant: %+v (all %+v)", st, a.Snapshot())
	}
	s.send(rspHdrs(false, ":status", "200", "content-type", "text/event-stream"))
	s.recv()
	s.send(rspBody(sse, true))
	s.recv()
	// usage: 7 prompt, 1 completion; GivenOnly tokenizer → no prediction of cached tokens.
	// (The fixture stream has no finish_reason: outcome truncated, still settled.)
	if st := state(a, "jwt-team"); st.Concurrent != 0 || st.WindowTokens != 8 {
		t.Fatalf("settlement: %+v", st)
	}
	if st := state(a, "edge-team"); st.WindowRequests != 0 {
		t.Fatalf("header attributed despite a verified claim: %+v", st)
	}
	if testutil.ToFloat64(h.ms.Admission.Requests.WithLabelValues("jwt-team", "default", "truncated")) != 1 ||
		testutil.ToFloat64(h.ms.Admission.Settlements.WithLabelValues("reported")) != 1 {
		t.Fatal("settled request not counted once")
	}

	h2 := newHarness(t)
	a2 := withAdmission(t, h2, func(c *config.Admission) { c.Identity = []string{"metadata"} })
	s2 := h2.open(t)
	s2.send(withPC(hdrs(false, post("/v1/chat/completions", "x-jwt-sub", "victim", "x-kvroute-tenant", "victim", "jwt_payload", `{"sub":"victim"}`)...), modeBuffered, modeStreamed))
	s2.recv()
	s2.send(body(chatBody, true))
	s2.recv()
	if st := state(a2, "victim"); st.WindowRequests != 0 || state(a2, admission.Unattributed).WindowRequests != 1 {
		t.Fatalf("forged claim headers attributed: %+v", a2.Snapshot())
	}
}

// An over-budget tenant is refused with an ImmediateResponse 429 carrying Retry-After,
// x-ratelimit-* and x-kvroute-rejected-reason: token_budget; the ticket is released. require_tenant answers 401 at the headers.
func TestExtProcBudgetRefusalAndRequireTenant(t *testing.T) {
	h := newHarness(t)
	withAdmission(t, h, func(c *config.Admission) {
		c.Identity = []string{"header"}
		c.Tenants = []config.TenantLimits{{Name: "small", Limits: config.Limits{TokensPerMinute: 10}}}
		c.RequireTenant = true
	})
	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions", "x-kvroute-tenant", "small")...), modeBuffered, modeStreamed))
	s.recv()
	s.send(body(strings.Replace(chatBody, `"stream":true`, `"stream":true,"max_tokens":50`, 1), true))
	ir := s.recv().GetImmediateResponse()
	got := map[string]string{}
	for _, o := range ir.GetHeaders().GetSetHeaders() {
		got[o.GetHeader().GetKey()] = string(o.GetHeader().GetRawValue())
	}
	if ir.GetStatus().GetCode() != 429 || got["retry-after"] == "" || got["x-ratelimit-limit-tokens"] != "10" || ir.GetDetails() != "kvroute_admission_tokens" ||
		got["x-kvroute-rejected-reason"] != "token_budget" {
		t.Fatalf("%v %v %s", ir.GetStatus(), got, ir.GetDetails())
	}
	if h.router.InFlight() != 0 {
		t.Fatal("refused request's ticket still booked")
	}

	s = h.open(t)
	s.send(withPC(hdrs(false, post("/v1/messages")...), modeBuffered, modeStreamed))
	ir = s.recv().GetImmediateResponse()
	if ir.GetStatus().GetCode() != 401 || !strings.Contains(string(ir.GetBody()), `"authentication_error"`) {
		t.Fatalf("%v %s", ir.GetStatus(), ir.GetBody())
	}
}

// A stream Envoy cancels mid-response pays its prompt and the content events streamed.
func TestExtProcAbortPaysWhatStreamed(t *testing.T) {
	h := newHarness(t)
	a := withAdmission(t, h, func(c *config.Admission) { c.Default.TokensPerMinute = 1e6 })
	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeBuffered, modeStreamed))
	s.recv()
	s.send(body(strings.Replace(chatBody, `"stream":true`, `"stream":true,"max_tokens":500`, 1), true))
	s.recv()
	if st := state(a, admission.Unattributed); st.WindowTokens != 500 {
		t.Fatalf("reserved %+v, want the 500-token output estimate", st)
	}
	s.send(rspHdrs(false, ":status", "200", "content-type", "text/event-stream"))
	s.recv()
	s.send(rspBody("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n", false))
	s.recv()
	s.cancel()
	h.waitEnded(t)
	if st := state(a, admission.Unattributed); st.WindowTokens != 2 || st.Concurrent != 0 {
		t.Fatalf("abort settlement %+v, want the 2 streamed tokens", st)
	}
	if testutil.ToFloat64(h.ms.Admission.Requests.WithLabelValues(admission.Unattributed, "default", "aborted")) != 1 {
		t.Fatal("abort not counted")
	}
}
