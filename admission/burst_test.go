package admission

import (
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/response"
)

// A burst of concurrent requests with max_tokens cannot push a window past its limit:
// each reserves what it may generate (min(max_tokens, admission.max_output_reservation)),
// not the learned estimate. Before, a tenant whose history said 64 output tokens
// reserved 10 + 64 per request, so all 25 of a burst of max_tokens: 300 fitted a
// 2,000 tokens/min budget and were charged 25 × 310 = 7,750 (3.9×).
func TestBurstWithMaxTokensStaysWithinBudget(t *testing.T) {
	now := fixed()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	c := config.Default().Admission
	c.Default.TokensPerMinute = 2000
	a, err := New(Options{Config: c, Metrics: metrics.NewUnregistered(), Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	id := Identity{Tenant: "t"}
	usage := func(out int) response.Result {
		return response.Result{Usage: response.Usage{Present: true, PromptTokens: 10, CompletionTokens: out}, Outcome: response.OutcomeOK}
	}
	// History: short answers (p90 64 output tokens).
	for range 10 {
		g, err := a.Reserve(id, Want{PromptTokens: 10, Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		g.Settle(usage(64), -1)
	}
	if e := a.outputEstimate("t", "m", 0); e != 64 {
		t.Fatalf("learned estimate %d, want 64", e)
	}
	mu.Lock()
	now = now.Add(time.Minute) // a fresh window
	mu.Unlock()

	const burst, maxTokens, limit = 25, 300, 2000
	grants := make(chan *Grant, burst)
	var wg sync.WaitGroup
	for range burst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if g, err := a.Reserve(id, Want{PromptTokens: 10, MaxTokens: maxTokens, Model: "m"}); err == nil {
				grants <- g
			}
		}()
	}
	wg.Wait()
	close(grants)
	admitted := 0
	for g := range grants {
		if g.Reserved() != 10+maxTokens {
			t.Fatalf("reserved %d, want prompt 10 + max_tokens %d", g.Reserved(), maxTokens)
		}
		g.Settle(usage(maxTokens), -1) // each generates all it may
		admitted++
	}
	charged := a.Snapshot()[0].WindowTokens
	// The bound: the limit plus one request's overrun past what it reserved (none here:
	// it reserved its whole max_tokens).
	if charged > limit {
		t.Fatalf("%d of %d admitted, charged %d tokens against %d/min", admitted, burst, charged, limit)
	}
	if admitted != limit/(10+maxTokens) {
		t.Fatalf("%d admitted, want the %d that fit", admitted, limit/(10+maxTokens))
	}
	t.Logf("25 concurrent max_tokens: 300 against 2,000 tokens/min: %d admitted, charged %d", admitted, charged)
}

// max_tokens above admission.max_output_reservation reserves the cap; no max_tokens
// reserves the estimate.
func TestOutputReservationCap(t *testing.T) {
	c := config.Default().Admission
	c.MaxOutputReservation, c.DefaultOutputTokens = 1000, 50
	a, err := New(Options{Config: c, Metrics: metrics.NewUnregistered(), Now: fixed})
	if err != nil {
		t.Fatal(err)
	}
	for maxTokens, want := range map[int]int{0: 50, 20: 20, 999: 999, 100000: 1000} {
		if got := a.outputEstimate("t", "m", maxTokens); got != want {
			t.Errorf("max_tokens %d reserves %d output tokens, want %d", maxTokens, got, want)
		}
	}
}
