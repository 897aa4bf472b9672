package extproc

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/router"
)

const dest = "x-gateway-destination-endpoint"

// finishSSE plays the response phases of a streamed chat answer in STREAMED response mode.
func finishSSE(t *testing.T, s *tstream) {
	t.Helper()
	s.send(rspHdrs(false, ":status", "200", "content-type", "text/event-stream"))
	if r := s.recv(); r.GetResponseHeaders() == nil {
		t.Fatalf("want response headers reply, got %v", r)
	}
	// Event boundaries deliberately not aligned with chunks (envoy#45437).
	for _, c := range []string{sse[:30], sse[30:90], sse[90:]} {
		s.send(rspBody(c, false))
		if r := s.recv(); r.GetResponseBody() == nil {
			t.Fatalf("want one response body reply per chunk, got %v", r)
		}
	}
	s.send(rspBody("", true))
	if r := s.recv(); r.GetResponseBody() == nil {
		t.Fatalf("want a reply to the empty final chunk, got %v", r)
	}
}

// BUFFERED: the headers reply is a plain CONTINUE (Envoy keeps holding the headers);
// the body reply carries the destination (PS handleHeadersResponse, §5.1).
func TestBufferedPicksOnBodyReply(t *testing.T) {
	h := newHarness(t)
	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions", "content-length", "120", dest, "6.6.6.6:1", "x-request-id", "rid-1")...), modeBuffered, modeStreamed))
	r := s.recv()
	if r.GetRequestHeaders() == nil || r.GetRequestHeaders().GetResponse().GetHeaderMutation() != nil || r.GetDynamicMetadata() != nil {
		t.Fatalf("BUFFERED headers reply must be a plain CONTINUE, got %v", r)
	}
	s.send(body(chatBody, true))
	r = s.recv()
	br := r.GetRequestBody().GetResponse()
	if br == nil {
		t.Fatalf("want request body reply, got %v", r)
	}
	addr := destOf(t, br.GetHeaderMutation(), dest)
	if addr != "10.0.0.1:8000" && addr != "10.0.0.2:8000" {
		t.Fatalf("destination = %q, want a worker address (client value must be overwritten)", addr)
	}
	if metaDest(r) != addr {
		t.Fatalf("envoy.lb metadata = %q, want %q (GIE: header and metadata agree)", metaDest(r), addr)
	}
	if br.GetBodyMutation() != nil || br.GetClearRouteCache() {
		t.Fatalf("body must not be mutated (content-length stays valid) and route cache not cleared by default: %v", br)
	}
	_, ts := h.router.Snapshot()
	if len(ts) != 1 || ts[0].RequestID != "rid-1" {
		t.Fatalf("open tickets = %+v, want one with request id from x-request-id", ts)
	}
	finishSSE(t, s)
	if n := h.router.InFlight(); n != 0 {
		t.Fatalf("in flight after end_of_stream = %d, want 0", n)
	}
	if v := testutil.ToFloat64(h.ms.Router.TicketsReleased.WithLabelValues("first_token")); v != 1 {
		t.Fatalf("first_token releases = %v, want 1", v)
	}
	if v := testutil.ToFloat64(h.ms.Router.TicketsReleased.WithLabelValues("done")); v != 1 {
		t.Fatalf("done releases = %v, want 1", v)
	}
	s.s.CloseSend()
	if err := h.waitEnded(t); err != nil {
		t.Fatalf("stream end after completion: %v", err)
	}
	if v := testutil.ToFloat64(h.ms.ExtProc.Aborts.WithLabelValues("closed")); v != 0 {
		t.Fatalf("a completed request must not count an abort, got %v", v)
	}
}

// BUFFERED with trailers: the body message has end_of_stream=false and is still the
// whole body (CC onTrailers); the trailers message follows.
func TestBufferedWithTrailers(t *testing.T) {
	h := newHarness(t)
	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeBuffered, modeStreamed))
	s.recv()
	s.send(body(chatBody, false))
	if a := destOf(t, s.recv().GetRequestBody().GetResponse().GetHeaderMutation(), dest); a == "" {
		t.Fatal("whole body with end_of_stream=false (trailers follow) must still carry the decision")
	}
	s.send(reqTrailers())
	if s.recv().GetRequestTrailers() == nil {
		t.Fatal("want a request trailers reply")
	}
}

// STREAMED: the headers reply releases the headers (§5.1): decision on headers; each
// chunk answered in order, empty non-final ones too (envoy#44101), final empty chunk.
func TestStreamedPicksOnHeadersAndAnswersEveryChunk(t *testing.T) {
	h := newHarness(t)
	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeStreamed, modeStreamed))
	r := s.recv()
	if destOf(t, r.GetRequestHeaders().GetResponse().GetHeaderMutation(), dest) == "" || metaDest(r) == "" {
		t.Fatalf("STREAMED: headers reply must carry the decision, got %v", r)
	}
	chunks := []*extprocv3.ProcessingRequest{body(chatBody[:10], false), body("", false), body(chatBody[10:], false), body("", true)}
	s.send(chunks...) // pipelined, without waiting (CC handleDataStreamedMode)
	for i := range chunks {
		r := s.recv()
		if r.GetRequestBody() == nil || r.GetRequestBody().GetResponse().GetHeaderMutation() != nil {
			t.Fatalf("chunk %d: want a plain body reply, got %v", i, r)
		}
	}
	// A repeated end_of_stream is tolerated and answered (envoy#46355).
	s.send(body("", true))
	if s.recv().GetRequestBody() == nil {
		t.Fatal("repeated end_of_stream must be answered")
	}
	finishSSE(t, s)
	if h.router.InFlight() != 0 {
		t.Fatal("ticket leaked")
	}
}

// STREAMED with send_body_without_waiting_for_header_response: the headers reply may be
// withheld until the body is read; then one reply per chunk, in order (EP).
func TestStreamedWithoutWaitingHoldsHeaders(t *testing.T) {
	h := newHarness(t)
	s := h.open(t)
	m := withPC(hdrs(false, post("/v1/chat/completions")...), modeStreamed, modeStreamed)
	m.ProtocolConfig.SendBodyWithoutWaitingForHeaderResponse = true
	s.send(m, body(chatBody[:20], false), body(chatBody[20:], false), body("", true))
	r := s.recv()
	if destOf(t, r.GetRequestHeaders().GetResponse().GetHeaderMutation(), dest) == "" {
		t.Fatalf("first reply must be the headers reply with the decision, got %v", r)
	}
	for i := 0; i < 3; i++ {
		if s.recv().GetRequestBody() == nil {
			t.Fatalf("want body reply %d", i)
		}
	}
	_, ts := h.router.Snapshot()
	if len(ts) != 1 || ts[0].Model != "m" {
		t.Fatalf("body-aware pick expected, tickets %+v", ts)
	}
}

// FULL_DUPLEX_STREAMED: headers reply withheld until end_of_stream, then the decision,
// then every body byte back as streamed_response (≤64 KiB each), end_of_stream on the
// last only (PM ordering rule; PS handleDuplexStreamedBodyResponse).
func TestFullDuplexHoldsHeadersAndEchoesEveryByte(t *testing.T) {
	h := newHarness(t)
	s := h.open(t)
	big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 150<<10) + `"}]}`
	s.send(withPC(hdrs(false, post("/v1/chat/completions", "content-length", "153700")...), modeFullDuplex, modeFullDuplex))
	for i := 0; i < len(big); i += 16 << 10 {
		s.send(body(big[i:min(i+16<<10, len(big))], false))
	}
	s.send(body("", true))
	r := s.recv()
	if destOf(t, r.GetRequestHeaders().GetResponse().GetHeaderMutation(), dest) == "" || metaDest(r) == "" {
		t.Fatalf("first reply must be the headers reply with the decision, got %v", r)
	}
	var got bytes.Buffer
	for {
		r := s.recv()
		sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			t.Fatalf("FULL_DUPLEX body replies must carry streamed_response, got %v", r)
		}
		if len(sr.GetBody()) > maxStreamedChunk {
			t.Fatalf("streamed_response of %d bytes, want ≤ 64 KiB", len(sr.GetBody()))
		}
		got.Write(sr.GetBody())
		if sr.GetEndOfStream() {
			break
		}
	}
	if got.String() != big {
		t.Fatalf("echoed %d bytes, want the %d sent (Envoy kept no copy)", got.Len(), len(big))
	}
	// Response in FULL_DUPLEX: each chunk echoed, end_of_stream on the last.
	s.send(rspHdrs(false, ":status", "200", "content-type", "text/event-stream"))
	s.recv()
	s.send(rspBody(sse, false), rspBody("", true))
	for _, wantEOS := range []bool{false, true} {
		sr := s.recv().GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil || sr.GetEndOfStream() != wantEOS {
			t.Fatalf("response streamed_response eos=%v, want %v", sr.GetEndOfStream(), wantEOS)
		}
	}
	if h.router.InFlight() != 0 {
		t.Fatal("ticket leaked")
	}
}

// FULL_DUPLEX with request trailers: trailers end the body; body replies keep
// end_of_stream=false, then the trailers reply (PM).
func TestFullDuplexTrailersEndBody(t *testing.T) {
	h := newHarness(t)
	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeFullDuplex, modeFullDuplex), body(chatBody, false), reqTrailers())
	if s.recv().GetRequestHeaders() == nil {
		t.Fatal("want headers reply first")
	}
	if sr := s.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse(); sr == nil || sr.GetEndOfStream() || string(sr.GetBody()) != chatBody {
		t.Fatalf("want the body back with end_of_stream=false, got %v", sr)
	}
	if s.recv().GetRequestTrailers() == nil {
		t.Fatal("want trailers reply last")
	}
}

// BUFFERED_PARTIAL cut at the buffer limit (end_of_stream=false): the model is sniffed
// and the pick made on that one reply (CC handleDataBufferedPartialMode).
func TestBufferedPartialCutBody(t *testing.T) {
	h := newHarness(t)
	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeBufferedPartial, modeStreamed))
	s.recv()
	s.send(body(chatBody[:40], false))
	if destOf(t, s.recv().GetRequestBody().GetResponse().GetHeaderMutation(), dest) == "" {
		t.Fatal("partial body reply must carry the decision")
	}
	_, ts := h.router.Snapshot()
	if len(ts) != 1 || ts[0].Model != "m" {
		t.Fatalf("model must be sniffed from the cut body, tickets %+v", ts)
	}
	s.send(body("rest", true)) // Envoy passes the rest through; answer anyway if sent
	s.recv()
}

// Headers with end_of_stream: no body follows in any mode (PS no_body_).
func TestHeadersOnly(t *testing.T) {
	h := newHarness(t)
	s := h.open(t)
	s.send(withPC(hdrs(true, ":method", "GET", ":path", "/v1/models"), modeBuffered, modeStreamed))
	if destOf(t, s.recv().GetRequestHeaders().GetResponse().GetHeaderMutation(), dest) == "" {
		t.Fatal("headers-only request on a non-inference path: load-only pick on the headers reply")
	}
	s.send(rspHdrs(true, ":status", "200"))
	s.recv()
	if h.router.InFlight() != 0 {
		t.Fatal("response headers with end_of_stream must complete the ticket")
	}
	// An inference path with no body is a client error.
	s2 := h.open(t)
	s2.send(withPC(hdrs(true, post("/v1/chat/completions")...), modeBuffered, modeStreamed))
	if ir := s2.recv().GetImmediateResponse(); ir.GetStatus().GetCode() != 400 {
		t.Fatalf("want 400 for a body-less chat request, got %v", ir)
	}
}

// Every refusal is one ImmediateResponse with the OpenAI error JSON (front.ErrorReply).
func TestImmediateResponses(t *testing.T) {
	cases := []struct {
		name   string
		opt    harnessOpt
		mode   mode
		msgs   []*extprocv3.ProcessingRequest
		status int
		typ    string
	}{
		{"malformed JSON", nil, modeBuffered, []*extprocv3.ProcessingRequest{body(`{"model":`, true)}, 400, "invalid_request_error"},
		{"unknown model", nil, modeBuffered, []*extprocv3.ProcessingRequest{body(`{"model":"nope","messages":[{"role":"user","content":"x"}]}`, true)}, 404, "NotFoundError"},
		{"oversize accumulated (FULL_DUPLEX)", func(c *config.ExtProc, _ *router.Options) { c.MaxBodyBytes = 1024 }, modeFullDuplex,
			[]*extprocv3.ProcessingRequest{body(strings.Repeat("a", 800), false), body(strings.Repeat("a", 800), false)}, 413, "invalid_request_error"},
		{"oversize buffered", func(c *config.ExtProc, _ *router.Options) { c.MaxBodyBytes = 1024 }, modeBuffered,
			[]*extprocv3.ProcessingRequest{body(strings.Repeat("a", 2000), true)}, 413, "invalid_request_error"},
		{"shed", func(_ *config.ExtProc, o *router.Options) { o.Policy = shedPolicy{} }, modeBuffered,
			[]*extprocv3.ProcessingRequest{body(chatBody, true)}, 429, "rate_limit_error"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var opts []harnessOpt
			if c.opt != nil {
				opts = append(opts, c.opt)
			}
			h := newHarness(t, opts...)
			s := h.open(t)
			s.send(withPC(hdrs(false, post("/v1/chat/completions")...), c.mode, modeStreamed))
			if c.mode == modeBuffered {
				s.recv()
			}
			s.send(c.msgs...)
			r := s.recv()
			checkImmediate(t, r, c.status, c.typ)
			if c.status == 429 {
				if ra := headerIn(r.GetImmediateResponse().GetHeaders(), "retry-after"); ra != "2" {
					t.Fatalf("retry-after = %q, want 2 (1.5 s rounded up)", ra)
				}
			}
			if h.router.InFlight() != 0 {
				t.Fatal("refused request must not hold a booking")
			}
			if v := testutil.ToFloat64(h.ms.ExtProc.ImmediateResponses.WithLabelValues(itoa(c.status))); v != 1 {
				t.Fatalf("immediate_responses_total{status=%d} = %v", c.status, v)
			}
		})
	}
}

// A declared content-length over the limit is refused on the headers (no buffering).
func TestOversizeContentLength(t *testing.T) {
	h := newHarness(t, func(c *config.ExtProc, _ *router.Options) { c.MaxBodyBytes = 2048 })
	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions", "content-length", "4096")...), modeBuffered, modeStreamed))
	checkImmediate(t, s.recv(), 413, "invalid_request_error")
}

// No healthy worker → 503 with retry-after: 1.
func TestNoHealthyWorker(t *testing.T) {
	h := newHarness(t)
	h.reg.SetHealthy("w1", false)
	h.reg.SetHealthy("w2", false)
	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeBuffered, modeStreamed))
	s.recv()
	s.send(body(chatBody, true))
	r := s.recv()
	checkImmediate(t, r, 503, "service_unavailable")
	if ra := headerIn(r.GetImmediateResponse().GetHeaders(), "retry-after"); ra != "1" {
		t.Fatalf("retry-after = %q, want 1", ra)
	}
}

func checkImmediate(t *testing.T, r *extprocv3.ProcessingResponse, status int, typ string) {
	t.Helper()
	ir := r.GetImmediateResponse()
	if ir == nil || int(ir.GetStatus().GetCode()) != status {
		t.Fatalf("want ImmediateResponse %d, got %v", status, r)
	}
	if ct := headerIn(ir.GetHeaders(), "content-type"); ct != "application/json" {
		t.Fatalf("content-type = %q, want application/json", ct)
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(ir.GetBody(), &e); err != nil || e.Error.Type != typ || e.Error.Code != status || e.Error.Message == "" {
		t.Fatalf("body %s: want OpenAI error JSON of type %s (%v)", ir.GetBody(), typ, err)
	}
	if ir.GetDetails() == "" || strings.ContainsAny(ir.GetDetails(), " \t") {
		t.Fatalf("details %q: want a token without whitespace", ir.GetDetails())
	}
}

func headerIn(m *extprocv3.HeaderMutation, key string) string {
	for _, o := range m.GetSetHeaders() {
		if o.GetHeader().GetKey() == key {
			return string(o.GetHeader().GetRawValue())
		}
	}
	return ""
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

// Envoy's default close is half-close + RST_STREAM (Canceled); graceful close is EOF.
// Either before completion aborts the ticket (CC onDestroy; GC close()).
func TestStreamEndBeforeCompletionAborts(t *testing.T) {
	for _, how := range []string{"cancelled", "closed"} {
		t.Run(how, func(t *testing.T) {
			h := newHarness(t)
			s := h.open(t)
			s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeStreamed, modeStreamed))
			s.recv()
			s.send(rspHdrs(false, ":status", "200", "content-type", "text/event-stream"))
			s.recv()
			if h.router.InFlight() != 1 {
				t.Fatal("want one booking in flight")
			}
			if how == "cancelled" {
				s.cancel()
			} else {
				s.s.CloseSend()
			}
			if err := h.waitEnded(t); err != nil && how == "closed" {
				t.Fatalf("EOF is a normal end, got %v", err)
			}
			if n := h.router.InFlight(); n != 0 {
				t.Fatalf("in flight = %d after the stream ended, want 0", n)
			}
			if v := testutil.ToFloat64(h.ms.ExtProc.Aborts.WithLabelValues(how)); v != 1 {
				t.Fatalf("aborts_total{reason=%s} = %v, want 1", how, v)
			}
		})
	}
}

// gRPC upstreams end with trailers; the last body chunk has end_of_stream=false
// (GIE PR #2510, envoy#37088): trailers complete the ticket.
func TestResponseTrailersComplete(t *testing.T) {
	h := newHarness(t)
	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeStreamed, modeStreamed))
	s.recv()
	s.send(rspHdrs(false, ":status", "200", "content-type", "text/event-stream"), rspBody(sse, false), rspTrailers())
	s.recv()
	s.recv()
	if s.recv().GetResponseTrailers() == nil {
		t.Fatal("want response trailers reply")
	}
	if h.router.InFlight() != 0 {
		t.Fatal("trailers must complete the ticket")
	}
}

// Response body mode NONE: Envoy closes the stream after the response headers reply;
// that is completion, not an abort.
func TestResponseModeNoneCompletesOnHeaders(t *testing.T) {
	h := newHarness(t, func(c *config.ExtProc, _ *router.Options) { c.WorkerHeader = "x-kvroute-worker" })
	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeStreamed, modeNone))
	s.recv()
	s.send(rspHdrs(false, ":status", "200"))
	r := s.recv()
	if w := headerIn(r.GetResponseHeaders().GetResponse().GetHeaderMutation(), "x-kvroute-worker"); w != "w1" && w != "w2" {
		t.Fatalf("worker header = %q", w)
	}
	s.cancel()
	h.waitEnded(t)
	if v := testutil.ToFloat64(h.ms.Router.TicketsReleased.WithLabelValues("done")); v != 1 {
		t.Fatalf("done = %v, want 1", v)
	}
	if v := testutil.ToFloat64(h.ms.Router.TicketsReleased.WithLabelValues("abort")); v != 0 {
		t.Fatalf("abort = %v, want 0", v)
	}
}

// Header mode SKIP: the first message is a body; nothing to decide, pass through
// (regression: a stream that skips a phase gets plain replies).
func TestHeaderSkipPassThrough(t *testing.T) {
	h := newHarness(t)
	s := h.open(t)
	s.send(withPC(body(chatBody, true), modeStreamed, modeStreamed))
	r := s.recv()
	if r.GetRequestBody() == nil || r.GetRequestBody().GetResponse() != nil {
		t.Fatalf("want a plain body reply, got %v", r)
	}
	s.send(rspHdrs(false, ":status", "200"), rspBody("{}", true))
	s.recv()
	s.recv()
	if h.router.InFlight() != 0 {
		t.Fatal("no ticket expected")
	}
}

// Without protocol_config (older Envoy) the configured mode is assumed.
func TestNoProtocolConfigUsesConfiguredMode(t *testing.T) {
	h := newHarness(t, func(c *config.ExtProc, _ *router.Options) {
		c.RequestBodyMode = "FULL_DUPLEX_STREAMED"
		c.MetadataNamespace = ""
	})
	s := h.open(t)
	s.send(hdrs(false, post("/v1/chat/completions")...), body(chatBody, true))
	r := s.recv()
	if destOf(t, r.GetRequestHeaders().GetResponse().GetHeaderMutation(), dest) == "" {
		t.Fatalf("want held headers reply with decision, got %v", r)
	}
	if r.GetDynamicMetadata() != nil {
		t.Fatal("metadata_namespace \"\" must disable dynamic metadata")
	}
	if s.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse() == nil {
		t.Fatal("want streamed_response")
	}
}

// Observability mode: Envoy does not wait and ignores replies: none are sent.
func TestObservabilityModeSendsNothing(t *testing.T) {
	h := newHarness(t)
	s := h.open(t)
	m := withPC(hdrs(false, post("/v1/chat/completions")...), modeStreamed, modeStreamed)
	m.ObservabilityMode = true
	s.send(m, body(chatBody, true))
	s.s.CloseSend()
	if _, err := s.s.Recv(); err == nil {
		t.Fatal("no reply expected in observability mode")
	}
	if h.router.InFlight() != 0 {
		t.Fatal("no booking in observability mode")
	}
}

// A ProcessingRequest without a phase is refused with InvalidArgument.
func TestEmptyRequestIsProtocolError(t *testing.T) {
	h := newHarness(t)
	s := h.open(t)
	s.send(&extprocv3.ProcessingRequest{})
	if _, err := s.s.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("want InvalidArgument, got %v", err)
	}
}

// A panic is recovered per stream, counted, and fails only that stream.
func TestPanicRecovered(t *testing.T) {
	h := newHarness(t)
	srvOpt := Options{Router: nil, Config: config.Default().ExtProc, Metrics: h.ms, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ps := &panicStream{}
	err := New(srvOpt).Process(ps)
	if status.Code(err) != codes.Internal {
		t.Fatalf("want Internal after a panic, got %v", err)
	}
	if v := testutil.ToFloat64(h.ms.ExtProc.Panics); v != 1 {
		t.Fatalf("panics_total = %v", v)
	}
}

// panicStream feeds one headers-only request; Router nil makes Pick panic.
type panicStream struct {
	extprocv3.ExternalProcessor_ProcessServer
	n int
}

func (p *panicStream) Context() context.Context { return context.Background() }
func (p *panicStream) Recv() (*extprocv3.ProcessingRequest, error) {
	p.n++
	return hdrs(true, ":method", "GET", ":path", "/v1/models"), nil
}
func (p *panicStream) Send(*extprocv3.ProcessingResponse) error { return nil }

// A trailing "/" is another path, as vLLM's routes are exact (FastAPI redirects
// /v1/chat/completions/ or 404s it): not parsed as chat, so a body-less POST to it is
// passed through with a load-only pick, where the exact path is refused 400. Before,
// the trailing "/" was trimmed and the request parsed (and refused) as chat.
func TestTrailingSlashIsNotAnInferencePath(t *testing.T) {
	h := newHarness(t)
	s := h.open(t)
	s.send(withPC(hdrs(true, post("/v1/chat/completions/")...), modeBuffered, modeStreamed))
	r := s.recv()
	if r.GetImmediateResponse() != nil || destOf(t, r.GetRequestHeaders().GetResponse().GetHeaderMutation(), dest) == "" {
		t.Fatalf("POST /v1/chat/completions/: %v, want a load-only pick on the headers reply", r)
	}
	s.send(rspHdrs(true, ":status", "307"))
	s.recv()
	if h.router.InFlight() != 0 {
		t.Fatal("ticket of the redirected request not completed")
	}
	s2 := h.open(t)
	s2.send(withPC(hdrs(true, post("/v1/chat/completions")...), modeBuffered, modeStreamed))
	if ir := s2.recv().GetImmediateResponse(); ir.GetStatus().GetCode() != 400 {
		t.Fatalf("exact path, no body: %v, want 400", ir)
	}
}
