package proxy

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring/scoringtest"
	"github.com/kvroute/kvroute/workers"
)

// Through the real proxy: with the only worker saturated, a request waits and, past max_queue_time, is answered 429 with
// x-kvroute-rejected-reason: queue_timeout; once the worker frees, the next is served.
func TestProxyQueueTimeoutThenServed(t *testing.T) {
	up := httptest.NewServer(sseWorker())
	t.Cleanup(up.Close)
	upSrv := strings.TrimPrefix(up.URL, "http://")
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "w", Address: upSrv, Models: []string{"m"}}})
	ms := metrics.NewUnregistered()
	r := router.New(router.Options{Registry: reg, Models: []router.Model{{Name: "m"}}, Metrics: ms, Policy: scoringtest.Busy{},
		Saturation: router.Saturation{MaxNumSeqs: 1}}) // one booked request saturates the worker
	c := config.Default().Admission
	c.Classes = []config.Class{{Name: "interactive", TTFTObjective: 500 * time.Millisecond, QueueLimit: 4, MaxQueueTime: 20 * time.Millisecond}}
	adm, err := admission.New(admission.Options{Config: c, Metrics: ms})
	if err != nil {
		t.Fatal(err)
	}
	r.OnCapacity(adm.Wake)
	ps := httptest.NewServer(New(Options{Router: r, Config: config.Default().ExtProc, Metrics: ms, Admission: adm}))
	t.Cleanup(ps.Close)
	srv := strings.TrimPrefix(ps.URL, "http://")
	busy, err := r.Pick(context.Background(), &request.Request{API: request.APICompletions, Model: "m", PromptTokenIDs: [][]uint32{{1}}}, router.PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`
	resp, b := admPost(t, "http://"+srv+"/v1/chat/completions", body, nil)
	if resp.StatusCode != 429 || resp.Header.Get(admission.RejectedReasonHeader) != admission.ReasonQueueTimeout ||
		resp.Header.Get("x-kvroute-class") != "interactive" || !strings.Contains(b, "max_queue_time") {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, b)
	}
	busy.Abort()
	if resp, b := admPost(t, "http://"+srv+"/v1/chat/completions", body, nil); resp.StatusCode != 200 {
		t.Fatalf("after the worker freed: %d %s", resp.StatusCode, b)
	}
}
