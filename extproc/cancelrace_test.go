package extproc

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// gatePolicy picks the first candidate once release is closed, after signalling entered.
type gatePolicy struct{ entered, release chan struct{} }

func (gatePolicy) Name() string { return "gate" }
func (p gatePolicy) Pick(*scoring.Input, []scoring.Candidate) scoring.Decision {
	p.entered <- struct{}{}
	<-p.release
	return scoring.Decision{Index: 0, Reason: "gate"}
}

// Issue 11 item 15: Envoy cancelling the stream while kvroute is about to reply (client
// gone) is a cancel: aborts{cancelled}, not aborts{send_error} nor phase_errors{send}.
func TestCancelRacingReplyIsACancel(t *testing.T) {
	gate := gatePolicy{entered: make(chan struct{}, 1), release: make(chan struct{})}
	h := newHarness(t, func(_ *config.ExtProc, o *router.Options) { o.Policy = gate })
	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeBuffered, modeStreamed))
	s.recv()
	var sctx = <-h.ctxs
	s.send(body(chatBody, true))
	select {
	case <-gate.entered: // the pick is under way; its reply is not sent yet
	case <-time.After(20 * time.Second):
		t.Fatal("the pick never started")
	}
	s.cancel()
	select {
	case <-sctx.Done(): // the server saw the cancel
	case <-time.After(20 * time.Second):
		t.Fatal("the server never saw the cancel")
	}
	close(gate.release)
	if err := h.waitEnded(t); err != nil {
		t.Fatalf("a cancelled stream ends without error, got %v", err)
	}
	if h.router.InFlight() != 0 {
		t.Fatal("booking leaked")
	}
	m := h.ms.ExtProc
	if v := testutil.ToFloat64(m.Aborts.WithLabelValues("send_error")); v != 0 {
		t.Errorf("aborts{send_error} = %v, want 0", v)
	}
	if v := testutil.ToFloat64(m.PhaseErrors.WithLabelValues("request_body", "send")); v != 0 {
		t.Errorf("phase_errors{request_body,send} = %v, want 0", v)
	}
	if v := testutil.ToFloat64(m.Aborts.WithLabelValues("cancelled")); v != 1 {
		t.Errorf("aborts{cancelled} = %v, want 1", v)
	}
}
