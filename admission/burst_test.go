package admission

import (
	"fmt"
	"math/rand/v2"
	"strings"
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

// A burst of concurrent requests against a real budget (the local backend, and one
// Redis shared by two replicas) with mixed max_tokens, each generating a random
// amount up to its max_tokens and settling while others still reserve: the window is
// charged at most its limit — each request reserved all it could generate, so no
// settlement adds to the window (the bound: limit + each admitted request's output
// beyond its reservation, here 0). The same burst with requests without max_tokens
// that generate beyond the output estimate is charged at most the limit plus the sum
// of those overruns, exactly as docs/tenants.md states.
func TestBurstAgainstRealBudgetBound(t *testing.T) {
	backends(t, func(t *testing.T, newA func(func() time.Time, func(*config.Admission)) (*Admitter, *metrics.Set)) {
		const limit, prompt, estimate = 8000, 20, 100
		mod := func(c *config.Admission) {
			c.Default.TokensPerMinute = limit
			c.DefaultOutputTokens = estimate
			c.OutputHistory.Samples, c.OutputHistory.MinSamples = 1024, 1024 // the estimate stays the default
		}
		replicas := []*Admitter{}
		a, _ := newA(fixed, mod)
		replicas = append(replicas, a)
		if strings.HasSuffix(t.Name(), "redis") {
			b, _ := newA(fixed, mod)
			replicas = append(replicas, b)
		}
		for _, withoutMax := range []int{0, 10} {
			t.Run(fmt.Sprintf("without_max=%d", withoutMax), func(t *testing.T) {
				tenant := fmt.Sprintf("t%d", withoutMax)
				id := Identity{Tenant: tenant}
				rng := rand.New(rand.NewPCG(7, uint64(withoutMax)))
				type req struct{ maxTokens, out int }
				var reqs []req
				for i := range 120 {
					if i < withoutMax {
						reqs = append(reqs, req{0, estimate + 1 + rng.IntN(200)}) // overruns the estimate
						continue
					}
					m := 50 + rng.IntN(400)
					reqs = append(reqs, req{m, rng.IntN(m + 1)})
				}
				var mu sync.Mutex
				var overrun, refused int64
				var wg sync.WaitGroup
				for i, r := range reqs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						g, err := replicas[i%len(replicas)].Reserve(id, Want{PromptTokens: prompt, MaxTokens: r.maxTokens, Model: "m"})
						if err != nil {
							if !is429(err, "tokens") {
								t.Errorf("request %d: %v", i, err)
							}
							mu.Lock()
							refused++
							mu.Unlock()
							return
						}
						if over := int64(prompt+r.out) - g.Reserved(); over > 0 {
							mu.Lock()
							overrun += over
							mu.Unlock()
						}
						g.Settle(okUsage(prompt, 0, r.out), -1)
					}()
				}
				wg.Wait()
				var charged int64
				for _, s := range a.Snapshot() {
					if s.Tenant == tenant {
						charged = s.WindowTokens
					}
				}
				if withoutMax == 0 && overrun != 0 {
					t.Fatalf("a request with max_tokens overran its reservation by %d", overrun)
				}
				if refused == 0 {
					t.Fatal("premise: the burst is larger than the budget, some requests must be refused")
				}
				if charged > limit+overrun || charged == 0 {
					t.Fatalf("charged %d against %d/min (+ overruns %d)", charged, limit, overrun)
				}
				t.Logf("%d replicas, 120 concurrent, %d without max_tokens: %d refused, charged %d of %d (overruns beyond reservations %d)", len(replicas), withoutMax, refused, charged, limit, overrun)
			})
		}
	})
}
