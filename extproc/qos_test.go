package extproc

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring/scoringtest"
)

func queueHarness(t *testing.T, maxQueue time.Duration) (*harness, *admission.Admitter) {
	h := newHarness(t, func(_ *config.ExtProc, ro *router.Options) {
		ro.Policy = scoringtest.Busy{}
		ro.Saturation = router.Saturation{MaxNumSeqs: 1} // one booked request saturates a worker
	})
	a := withAdmission(t, h, func(c *config.Admission) {
		c.Classes = []config.Class{{Name: "interactive", Priority: 1, TTFTObjective: 500 * time.Millisecond, QueueLimit: 4, MaxQueueTime: maxQueue}}
	})
	h.router.OnCapacity(a.Wake)
	for i := 0; i < 2; i++ { // both workers saturated
		if _, err := h.router.Pick(context.Background(), &request.Request{API: request.APICompletions, Model: "m", PromptTokenIDs: [][]uint32{{1, 2}}}, router.PickOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return h, a
}

// Through the ext_proc server: a request waiting past max_queue_time gets a 429
// ImmediateResponse with x-kvroute-rejected-reason.
func TestExtProcQueueTimeoutRejects(t *testing.T) {
	h, _ := queueHarness(t, 20*time.Millisecond)
	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeBuffered, modeStreamed))
	s.recv()
	s.send(body(chatBody, true))
	ir := s.recv().GetImmediateResponse()
	got := map[string]string{}
	for _, o := range ir.GetHeaders().GetSetHeaders() {
		got[o.GetHeader().GetKey()] = string(o.GetHeader().GetRawValue())
	}
	if ir.GetStatus().GetCode() != 429 || got[admission.RejectedReasonHeader] != admission.ReasonQueueTimeout || ir.GetDetails() != "kvroute_queue_timeout" {
		t.Fatalf("%v %v %s", ir.GetStatus(), got, ir.GetDetails())
	}
}

// Envoy closing the stream while the request waits (client gone) removes its entry.
func TestExtProcQueuedStreamClosedRemoves(t *testing.T) {
	h, a := queueHarness(t, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	st, err := h.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st.Send(withPC(hdrs(false, post("/v1/chat/completions")...), modeBuffered, modeStreamed))
	st.Recv()
	st.Send(body(chatBody, true))
	for a.QueueDepths()["interactive"] != 1 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	h.waitEnded(t)
	if d := a.QueueDepths()["interactive"]; d != 0 {
		t.Fatalf("queue depth %d after the stream closed", d)
	}
}
