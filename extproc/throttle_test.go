package extproc

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/router"
)

// withSource is r with Envoy's source.address attribute, as the ext_proc filter sends
// it when its request_attributes list "source.address".
func withSource(t *testing.T, r *extprocv3.ProcessingRequest, addr string) *extprocv3.ProcessingRequest {
	t.Helper()
	st, err := structpb.NewStruct(map[string]any{"source.address": addr})
	if err != nil {
		t.Fatal(err)
	}
	r.Attributes = map[string]*structpb.Struct{attributesKey: st}
	return r
}

// On ext_proc, failed API keys are throttled per client as Envoy names it
// (source.address attribute): after admission.auth_throttle.failures unknown keys from
// one client its next request, right key included, is an ImmediateResponse 429 in the
// request's API shape, while another client's right key passes; a request without the
// attribute is never throttled (the throttle never lumps unknown clients together).
func TestExtProcThrottlesFailedAPIKeysBySourceAddress(t *testing.T) {
	sum := sha256.Sum256([]byte("sk-a"))
	keys := t.TempDir() + "/keys"
	if err := os.WriteFile(keys, []byte(hex.EncodeToString(sum[:])+" alpha\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t)
	withAdmission(t, h, func(c *config.Admission) {
		c.Identity, c.APIKeysFile, c.RequireTenant = []string{"api_key"}, keys, true
		c.AuthThrottle = config.AuthThrottle{Failures: 2, Window: time.Minute, MaxClients: 10}
	})
	try := func(path, src, key string) *extprocv3.ProcessingResponse {
		s := h.open(t)
		defer s.cancel()
		r := withPC(hdrs(false, post(path, "authorization", "Bearer "+key)...), modeBuffered, modeStreamed)
		if src != "" {
			r = withSource(t, r, src)
		}
		s.send(r)
		return s.recv()
	}
	for i := 0; i < 2; i++ {
		checkImmediate(t, try("/v1/chat/completions", "203.0.113.9:40000", "sk-guess"), 401, "authentication_error")
	}
	r := try("/v1/chat/completions", "203.0.113.9:40001", "sk-a")
	checkImmediate(t, r, 429, "rate_limit_exceeded")
	if got := headerIn(r.GetImmediateResponse().GetHeaders(), router.RejectedReasonHeader); got != "auth_throttled" {
		t.Fatalf("x-kvroute-rejected-reason = %q, want auth_throttled", got)
	}
	ir := try("/v1/messages", "203.0.113.9:40002", "sk-a").GetImmediateResponse()
	if ir.GetStatus().GetCode() != 429 || !strings.HasPrefix(string(ir.GetBody()), `{"type":"error"`) || ir.GetDetails() != "kvroute_admission_auth_throttled" ||
		headerIn(ir.GetHeaders(), router.RejectedReasonHeader) != "auth_throttled" {
		t.Fatalf("Anthropic: %v %s %s %v", ir.GetStatus(), ir.GetBody(), ir.GetDetails(), ir.GetHeaders())
	}
	if r := try("/v1/chat/completions", "198.51.100.1:1", "sk-a"); r.GetImmediateResponse() != nil {
		t.Fatalf("another client's right key: %v", r)
	}
	for i := 0; i < 5; i++ { // no source.address: counted as unknown keys, never throttled
		checkImmediate(t, try("/v1/chat/completions", "", "sk-guess"), 401, "authentication_error")
	}
	if v := testutil.ToFloat64(h.ms.Admission.AuthThrottled); v != 2 {
		t.Fatalf("auth_throttled_total = %v, want 2", v)
	}
}

// An oversize body on ext_proc is refused in the request's API shape: declared by
// content-length (at the headers) on /v1/messages, Anthropic's request_too_large; the
// accumulated bytes on /v1/chat/completions, OpenAI's invalid_request_error. (A body
// past Envoy's own buffer limit never reaches kvroute: Envoy answers that 413 itself.)
func TestExtProcOversizeInAPIShape(t *testing.T) {
	h := newHarness(t, func(c *config.ExtProc, _ *router.Options) { c.MaxBodyBytes = 2048 })
	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/messages", "content-length", "1000000")...), modeBuffered, modeStreamed))
	ir := s.recv().GetImmediateResponse()
	if ir.GetStatus().GetCode() != 413 || !strings.HasPrefix(string(ir.GetBody()), `{"type":"error"`) || !strings.Contains(string(ir.GetBody()), "request_too_large") {
		t.Fatalf("Anthropic declared: %v %s", ir.GetStatus(), ir.GetBody())
	}
	s.cancel()
	s = h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeFullDuplex, modeStreamed))
	s.send(body(strings.Repeat("a", 1500), false), body(strings.Repeat("a", 1500), false))
	checkImmediate(t, s.recv(), 413, "invalid_request_error")
	h.waitEnded(t)
	if h.router.InFlight() != 0 {
		t.Fatal("an oversize body booked a worker")
	}
}
