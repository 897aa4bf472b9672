package router

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/workers"
)

// specFixture: two workers serving "m" (block size 16), a real kvindex with a
// speculative TTL, the first-candidate policy.
func specFixture(t testing.TB, models ...Model) (*Router, *kvindex.Index, *workers.Registry) {
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "w0", Address: "10.0.0.1:8000", Models: []string{"m"}},
		{Name: "w1", Address: "10.0.0.2:8000", Models: []string{"m"}}})
	ix := kvindex.New(kvindex.Options{SpeculativeTTL: time.Hour})
	if models == nil {
		models = []Model{{Name: "m", BlockSize: 16}}
	}
	r := New(Options{Registry: reg, Index: ix, Policy: firstPolicy{}, Metrics: metrics.NewUnregistered(), Models: models})
	return r, ix, reg
}

func promptOf(n, seed int) *request.Request {
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(seed*1_000_003+i) % 151_000
	}
	return &request.Request{API: request.APICompletions, Model: "m", PromptTokenIDs: [][]uint32{ids}}
}

// A 1e6-token prompt books a bounded number of speculative entries: the prompt tokens
// routing considers are capped (DefaultMaxPromptTokens without a model context length),
// while the prediction still sees the whole prompt.
func TestHugePromptBooksBoundedSpeculativeEntries(t *testing.T) {
	r, ix, _ := specFixture(t)
	tk, err := r.Pick(context.Background(), promptOf(1_000_000, 1), PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Done(200, response.Usage{}, time.Time{})
	if want := int64(DefaultMaxPromptTokens / 16); ix.Entries() != want {
		t.Fatalf("a 1e6-token prompt booked %d speculative entries, want the cap's %d blocks", ix.Entries(), want)
	}
	if tk.PromptTokens != 1_000_000 {
		t.Fatalf("ticket prompt tokens %d, want the whole prompt", tk.PromptTokens)
	}
}

// A model's context length (vLLM --max-model-len) caps its prompts instead.
func TestModelContextCapsSpeculativeEntries(t *testing.T) {
	r, ix, _ := specFixture(t, Model{Name: "m", BlockSize: 16, MaxModelLen: 4096})
	tk, err := r.Pick(context.Background(), promptOf(100_000, 1), PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Done(200, response.Usage{}, time.Time{})
	if ix.Entries() != 4096/16 {
		t.Fatalf("booked %d speculative entries, want 256 (4,096 tokens / 16)", ix.Entries())
	}
	if v := testutil.ToFloat64(r.m.PromptsCapped); v != 1 {
		t.Fatalf("prompts_capped_total = %v, want 1", v)
	}
}

// An aborted ticket's speculative entries are gone, and so are those of a request the
// worker refused (status ≥ 400); a completed request's, or one aborted after its first
// token, stay. A prefix another open ticket booked first is never withdrawn.
func TestFailedOrAbortedTicketWithdrawsSpeculativeEntries(t *testing.T) {
	ctx := context.Background()
	held := func(ix *kvindex.Index, req *request.Request, w string) int {
		keys := kvindex.HashBlocks(kvindex.Namespace{Model: "m"}.Seed(), req.PromptTokenIDs[0], 16, nil)
		for _, m := range ix.Lookup(keys, nil) {
			if m.Worker == w {
				return m.Blocks
			}
		}
		return 0
	}
	for _, c := range []struct {
		name string
		end  func(*Ticket)
		want int // blocks still held on w0
	}{
		{"abort", func(t *Ticket) { t.Abort() }, 0},
		{"refused 503", func(t *Ticket) { t.Done(503, response.Usage{}, time.Time{}) }, 0},
		{"refused 400", func(t *Ticket) { t.Done(400, response.Usage{}, time.Time{}) }, 0},
		{"done 200", func(t *Ticket) { t.Done(200, response.Usage{}, time.Time{}) }, 64},
		{"abort after first token", func(t *Ticket) { t.FirstToken(time.Time{}); t.Abort() }, 64},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, ix, _ := specFixture(t)
			req := promptOf(1024, 2)
			tk, err := r.Pick(ctx, req, PickOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := held(ix, req, "w0"); got != 64 {
				t.Fatalf("booked %d blocks on w0, want 64", got)
			}
			c.end(tk)
			if got := held(ix, req, "w0"); got != c.want {
				t.Fatalf("after %s: w0 holds %d blocks, want %d", c.name, got, c.want)
			}
			if c.want == 0 && ix.Entries() != 0 {
				t.Fatalf("%d index entries left", ix.Entries())
			}
		})
	}
	t.Run("shared prefix stays", func(t *testing.T) {
		r, ix, _ := specFixture(t)
		first := promptOf(512, 3)
		longer := &request.Request{API: request.APICompletions, Model: "m",
			PromptTokenIDs: [][]uint32{append(append([]uint32{}, first.PromptTokenIDs[0]...), promptOf(512, 4).PromptTokenIDs[0]...)}}
		t1, err := r.Pick(ctx, first, PickOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t2, err := r.Pick(ctx, longer, PickOptions{})
		if err != nil || t2.Worker != t1.Worker {
			t.Fatal(t2, err)
		}
		if t2.CachedTokens != 512 {
			t.Fatalf("the longer request's cached prefix on %s: %d tokens, want the first request's 512", t2.Worker, t2.CachedTokens)
		}
		t2.Abort()
		if got := held(ix, longer, "w0"); got != 32 {
			t.Fatalf("after the longer request aborted, w0 holds %d blocks, want the first request's 32", got)
		}
		t1.Done(200, response.Usage{}, time.Time{})
	})
}

// Speculative entries are booked outside the router lock, racing worker removal: a
// removed worker never keeps index entries (its booking lands before the cleanup, or
// sees its ticket released). Run with -race.
func TestBookingRacesWorkerRemoval(t *testing.T) {
	r, ix, reg := specFixture(t)
	w0 := &workers.Worker{Name: "w0", Address: "10.0.0.1:8000", Models: []string{"m"}}
	w1 := &workers.Worker{Name: "w1", Address: "10.0.0.2:8000", Models: []string{"m"}}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				tk, err := r.Pick(context.Background(), promptOf(256, g*1000+i), PickOptions{})
				if err == nil {
					tk.Done(200, response.Usage{}, time.Time{})
				}
			}
		}()
	}
	for i := 0; i < 100; i++ {
		reg.Set([]*workers.Worker{w1})
		reg.Set([]*workers.Worker{w0, w1})
	}
	wg.Wait()
	reg.Set([]*workers.Worker{w1})
	for _, name := range ix.Workers() {
		if name == "w0" {
			t.Fatal("removed worker w0 is still indexed")
		}
	}
	if n := r.InFlight(); n != 0 {
		t.Fatalf("%d tickets open", n)
	}
}
