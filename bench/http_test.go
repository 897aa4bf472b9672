package bench

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/sim"
)

func TestRunHTTPChatMultiTurnAndErrors(t *testing.T) {
	p := smallProfile()
	p.StepOverhead, p.PrefillPerToken, p.DecodePerSeq = time.Millisecond, 2*time.Microsecond, 100*time.Microsecond
	wk, err := sim.NewWorker(sim.WorkerOptions{Profile: p, PromptTokensDetails: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go wk.Runner.Run(ctx)
	srv := httptest.NewServer(wk)
	defer srv.Close()

	w := MultiTurn(MultiTurnOptions{Conversations: 2, Turns: 2, SystemTokens: 100, UserTokens: 20, OutputTokens: 4, Seed: 1})
	arr := Arrivals{Kind: "streams", Streams: 1}
	rs := RunHTTP(ctx, arr.Apply(w), HTTPTarget{Name: "one", URLs: []string{srv.URL}}, HTTPOptions{Arrivals: arr, Model: "m", API: "chat"})
	for i, r := range rs {
		if r.Err != "" || r.TTFT <= 0 || r.E2E < r.TTFT || r.OutputTokens != 4 {
			t.Fatalf("request %d: %+v", i, r)
		}
		if want := len(w.Items[i].EngineTokens()); r.PromptTokens != want {
			t.Errorf("request %d: prompt tokens %d, want %d (chat over HTTP = engine tokens)", i, r.PromptTokens, want)
		}
		if w.Items[i].Turn == 1 && r.CachedTokens == 0 {
			t.Errorf("request %d: second turn reused nothing", i)
		}
	}
	bad := RunHTTP(ctx, w, HTTPTarget{Name: "bad", URLs: []string{srv.URL}}, HTTPOptions{Arrivals: arr, Model: "other"})
	if !strings.HasPrefix(bad[0].Err, "HTTP 404") {
		t.Errorf("wrong model: %q", bad[0].Err)
	}
	gone := RunHTTP(ctx, w, HTTPTarget{Name: "gone", URLs: []string{"http://127.0.0.1:1"}}, HTTPOptions{Arrivals: arr, Model: "m"})
	if gone[0].Err == "" {
		t.Error("unreachable target gave no error")
	}
	n, err := ScrapeCounter(ctx, srv.Client(), srv.URL+"/metrics", "vllm:request_success_total")
	if err != nil || n != 4 {
		t.Errorf("scraped %v requests (%v), want 4", n, err)
	}
}
