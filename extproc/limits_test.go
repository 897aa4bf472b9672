package extproc

import (
	"io"
	"testing"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/router"
)

// Issue 10 item 8: body modes outside the enum (protocol_config is input) become the
// label "unknown": 50 streams with 50 different values add one series, not 50.
func TestUnknownBodyModeLabelIsBounded(t *testing.T) {
	h := newHarness(t)
	for i := 0; i < 50; i++ {
		s := h.open(t)
		s.send(withPC(hdrs(false, post("/v1/chat/completions")...), procmodev3.ProcessingMode_BodySendMode(1000+i), modeStreamed))
		s.recv()
		s.cancel()
		h.waitEnded(t)
	}
	if n := testutil.CollectAndCount(h.ms.ExtProc.Streams); n != 1 {
		t.Fatalf("streams_total has %d series, want 1 (unknown)", n)
	}
	if v := testutil.ToFloat64(h.ms.ExtProc.Streams.WithLabelValues("unknown")); v != 50 {
		t.Fatalf("streams_total{mode=unknown} = %v, want 50", v)
	}
}

// Issue 10 item 8: at most extproc.max_streams streams are open; the next fails at once
// with RESOURCE_EXHAUSTED and books nothing; a slot freed is usable again.
func TestMaxStreams(t *testing.T) {
	h := newHarness(t, func(c *config.ExtProc, _ *router.Options) { c.MaxStreams = 2 })
	var open []*tstream
	for i := 0; i < 2; i++ {
		s := h.open(t)
		s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeBuffered, modeStreamed))
		s.recv() // the stream is inside Process, holding a slot
		open = append(open, s)
	}
	s := h.open(t)
	// gRPC: the server may end the refused stream before the client's first message is
	// written; Send then returns io.EOF and the status comes from Recv.
	if err := s.s.Send(withPC(hdrs(false, post("/v1/chat/completions")...), modeBuffered, modeStreamed)); err != nil && err != io.EOF {
		t.Fatalf("send: %v", err)
	}
	if _, err := s.s.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third stream with max_streams 2: %v, want RESOURCE_EXHAUSTED", err)
	}
	h.waitEnded(t)
	if v := testutil.ToFloat64(h.ms.ExtProc.StreamsRefused.WithLabelValues("max_streams")); v != 1 {
		t.Fatalf("streams_refused_total{max_streams} = %v", v)
	}
	open[0].cancel()
	h.waitEnded(t)
	s = h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeBuffered, modeStreamed))
	if r := s.recv(); r.GetRequestHeaders() == nil {
		t.Fatalf("a freed slot must serve a new stream: %v", r)
	}
}

// Issue 10 item 8: a stream sending more than extproc.max_messages_per_second fails
// with RESOURCE_EXHAUSTED and its booking is released. 60 messages at a limit of 5/s
// would take 11 s to be legal, so the bound holds on any machine.
func TestMessageRateLimit(t *testing.T) {
	h := newHarness(t, func(c *config.ExtProc, _ *router.Options) { c.MaxMessagesPerSecond = 5 })
	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeBuffered, modeStreamed))
	s.recv()
	s.send(body(chatBody, true))
	s.recv()
	if h.router.InFlight() != 1 {
		t.Fatal("premise: the request is booked")
	}
	var err error
	for i := 0; i < 60 && err == nil; i++ {
		if err = s.s.Send(rspBody("data: {}\n\n", false)); err == nil || err == io.EOF {
			_, err = s.s.Recv() // io.EOF from Send: the server ended the stream; Recv has its status
		}
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("60 messages at 5/s: %v, want RESOURCE_EXHAUSTED", err)
	}
	h.waitEnded(t)
	if h.router.InFlight() != 0 {
		t.Fatal("the refused stream's booking leaked")
	}
	if v := testutil.ToFloat64(h.ms.ExtProc.StreamsRefused.WithLabelValues("message_rate")); v != 1 {
		t.Fatalf("streams_refused_total{message_rate} = %v", v)
	}
}
