package extproc

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/classify"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/workers"
)

func classifyHarness(t *testing.T) *harness {
	h := newHarness(t)
	withAdmission(t, h, func(c *config.Admission) {
		c.Classes = []config.Class{{Name: "batch", Priority: -1, Match: config.ClassMatch{Tenants: []string{"nobody"}}}} // only by the rule
	})
	rs, err := classify.Compile([]classify.RuleSpec{
		{Name: "secrets", PII: []string{"aws_access_key"}, Refuse: true},
		{Name: "drafts", Regex: `(?i)\bdraft\b`, Tag: true},
		{Name: "reports", Regex: `\breport\b`, Class: "batch"},
		{Name: "stem", Regex: `\bintegral\b`, Workers: []string{"10.0.0.2:8000"}},
	}, nil, []string{"batch"})
	if err != nil {
		t.Fatal(err)
	}
	rs.Count(h.ms.Classify)
	h.srv.opt.Classify = rs
	return h
}

// bufferedPick sends a BUFFERED request (Envoy's buffered request body mode: headers,
// then the whole body, one reply to the body message) and returns the body's reply.
func bufferedPick(t *testing.T, h *harness, path, b string, extra ...string) *extprocv3.ProcessingResponse {
	s := h.open(t)
	s.send(withPC(hdrs(false, post(path, extra...)...), modeBuffered, modeStreamed))
	s.recv()
	s.send(body(b, true))
	return s.recv()
}

func chatWith(text string) string {
	return `{"model":"m","messages":[{"role":"user","content":"` + text + `"}]}`
}

// Through the ext_proc server with classify rules, Envoy BUFFERED mode: a secret is an
// ImmediateResponse 403 in the request's API shape; a tag is a request header mutation
// (a client's forged copy is removed when no rule tags); a class rule's request is
// picked (the class itself is asserted through the proxy); each decision is counted.
func TestExtProcClassifyStage(t *testing.T) {
	h := classifyHarness(t)
	ir := bufferedPick(t, h, "/v1/chat/completions", chatWith("AKIAIOSFODNN7EXAMPLE")).GetImmediateResponse()
	if ir.GetStatus().GetCode() != 403 || ir.GetDetails() != "kvroute_classify_refused" || !strings.Contains(string(ir.GetBody()), "permission_error") {
		t.Fatalf("OpenAI refusal: %v %s %s", ir.GetStatus(), ir.GetDetails(), ir.GetBody())
	}
	ir = bufferedPick(t, h, "/v1/messages", `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"AKIAIOSFODNN7EXAMPLE"}]}`).GetImmediateResponse()
	if ir.GetStatus().GetCode() != 403 || !strings.Contains(string(ir.GetBody()), `"type":"error"`) {
		t.Fatalf("Anthropic refusal: %v %s", ir.GetStatus(), ir.GetBody())
	}
	mut := bufferedPick(t, h, "/v1/chat/completions", chatWith("a DRAFT"), classify.TagHeader, "rule=vip").GetRequestBody().GetResponse().GetHeaderMutation()
	if got := destOf(t, mut, classify.TagHeader); got != "rule=drafts" {
		t.Fatalf("tag header %q", got)
	}
	mut = bufferedPick(t, h, "/v1/chat/completions", chatWith("hello"), classify.TagHeader, "rule=vip").GetRequestBody().GetResponse().GetHeaderMutation()
	if !slices.Contains(mut.GetRemoveHeaders(), classify.TagHeader) {
		t.Fatalf("untagged request: remove_headers %v, want the tag header", mut.GetRemoveHeaders())
	}
	for _, sh := range mut.GetSetHeaders() {
		if sh.GetHeader().GetKey() == classify.TagHeader {
			t.Fatalf("untagged request sets %v", sh)
		}
	}
	if r := bufferedPick(t, h, "/v1/chat/completions", chatWith("the report")); r.GetRequestBody() == nil {
		t.Fatalf("class rule: %v", r)
	}
	for i := 0; i < 4; i++ { // the rule's pool: always w2, though both are idle
		mut := bufferedPick(t, h, "/v1/chat/completions", chatWith("the integral of x")).GetRequestBody().GetResponse().GetHeaderMutation()
		if got := destOf(t, mut, config.Default().ExtProc.DestinationHeader); got != "10.0.0.2:8000" {
			t.Fatalf("pick %d: destination %q, want the rule's worker 10.0.0.2:8000", i, got)
		}
	}
	for _, c := range []struct {
		rule, action string
		n            float64
	}{{"secrets", "refuse", 2}, {"drafts", "tag", 1}, {"none", "none", 1}, {"reports", "class", 1}, {"stem", "workers", 4}} {
		if v := testutil.ToFloat64(h.ms.Classify.Decisions.WithLabelValues(c.rule, "none", c.action)); v != c.n {
			t.Errorf("decisions{rule=%s,action=%s} = %v, want %v", c.rule, c.action, v, c.n)
		}
	}
}

// A model rule through the ext_proc server: in BUFFERED and FULL_DUPLEX_STREAMED the
// body sent upstream carries the rewritten model (with its content-length in BUFFERED)
// and the pick is the rewritten model's worker; in BUFFERED_PARTIAL, where Envoy passes
// the body on as it holds it, the rewrite is skipped (the model's own workers, no body
// mutation) and counted so.
func TestExtProcClassifyModelRewrite(t *testing.T) {
	h := newHarness(t, func(_ *config.ExtProc, ro *router.Options) {
		ro.Models = append(ro.Models, router.Model{Name: "small"})
	})
	h.reg.Set([]*workers.Worker{
		{Name: "w1", Address: "10.0.0.1:8000", Models: []string{"m"}},
		{Name: "w3", Address: "10.0.0.3:8000", Models: []string{"small"}},
	})
	rs, err := classify.Compile([]classify.RuleSpec{{Name: "greetings", Regex: `(?i)^hello`, Model: "small"}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rs.Count(h.ms.Classify)
	h.srv.opt.Classify = rs
	const in = `{"model":"m","messages":[{"role":"user","content":"hello there"}],"n":1.0}`
	const want = `{"model":"small","messages":[{"role":"user","content":"hello there"}],"n":1.0}`
	dest := config.Default().ExtProc.DestinationHeader

	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions", "content-length", strconv.Itoa(len(in)))...), modeBuffered, modeStreamed))
	s.recv()
	s.send(body(in, true))
	cr := s.recv().GetRequestBody().GetResponse()
	if got := string(cr.GetBodyMutation().GetBody()); got != want {
		t.Fatalf("BUFFERED body mutation %q, want %q", got, want)
	}
	if got := destOf(t, cr.GetHeaderMutation(), "content-length"); got != strconv.Itoa(len(want)) {
		t.Fatalf("content-length %q, want %d", got, len(want))
	}
	if got := destOf(t, cr.GetHeaderMutation(), dest); got != "10.0.0.3:8000" {
		t.Fatalf("BUFFERED destination %q, want small's worker 10.0.0.3:8000", got)
	}

	s = h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeFullDuplex, modeStreamed), body(in, true))
	if got := destOf(t, s.recv().GetRequestHeaders().GetResponse().GetHeaderMutation(), dest); got != "10.0.0.3:8000" {
		t.Fatalf("FULL_DUPLEX destination %q, want 10.0.0.3:8000", got)
	}
	if sr := s.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse(); string(sr.GetBody()) != want || !sr.GetEndOfStream() {
		t.Fatalf("FULL_DUPLEX streamed_response %q, want %q", sr.GetBody(), want)
	}

	s = h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeBufferedPartial, modeStreamed))
	s.recv()
	s.send(body(in, true))
	cr = s.recv().GetRequestBody().GetResponse()
	if bm := cr.GetBodyMutation(); bm != nil {
		t.Fatalf("BUFFERED_PARTIAL body mutated: %v", bm)
	}
	if got := destOf(t, cr.GetHeaderMutation(), dest); got != "10.0.0.1:8000" {
		t.Fatalf("BUFFERED_PARTIAL destination %q, want m's worker 10.0.0.1:8000 (rewrite skipped)", got)
	}
	for outcome, n := range map[string]float64{"applied": 2, "skipped": 1} {
		if v := testutil.ToFloat64(h.ms.Classify.Rewrites.WithLabelValues("greetings", outcome)); v != n {
			t.Errorf("rewrites{outcome=%s} = %v, want %v", outcome, v, n)
		}
	}
}
