package scoring_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// stand builds a real router over n workers with a real kvindex (speculative entries on).
func stand(t testing.TB, n int, policy string) (*router.Router, *kvindex.Index) {
	t.Helper()
	reg := workers.NewRegistry()
	var ws []*workers.Worker
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("w%02d", i)
		ws = append(ws, &workers.Worker{Name: name, Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Models: []string{"m"}})
	}
	reg.Set(ws)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ix := kvindex.New(kvindex.Options{SpeculativeTTL: time.Minute, Now: func() time.Time { return now }})
	pol, err := scoring.New(policy, scoring.Options{Rand: rand.New(rand.NewPCG(1, 2))})
	if err != nil {
		t.Fatal(err)
	}
	r := router.New(router.Options{Registry: reg, Index: ix, Policy: pol, Models: []router.Model{{Name: "m", BlockSize: 16}},
		Now: func() time.Time { return now }})
	return r, ix
}

func tokens(seed, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(seed*1_000_003 + i)
	}
	return out
}

func completion(toks []uint32) *request.Request {
	return &request.Request{API: request.APICompletions, Model: "m", PromptTokenIDs: [][]uint32{toks}}
}

// TestBurstOfDistinctRequestsSpreadsEvenly: 64 different cold prompts arriving together
// on 8 idle workers land 8 per worker — each pick sees the bookings of the picks before it.
func TestBurstOfDistinctRequestsSpreadsEvenly(t *testing.T) {
	r, _ := stand(t, 8, scoring.PolicyKVRoute)
	count := map[string]int{}
	for i := 0; i < 64; i++ {
		tk, err := r.Pick(context.Background(), completion(tokens(i, 1024)), router.PickOptions{})
		if err != nil {
			t.Fatal(err)
		}
		count[tk.Worker]++
	}
	for w, n := range count {
		if n != 8 {
			t.Fatalf("burst not spread evenly: %s got %d (%v)", w, n, count)
		}
	}
}

// TestBurstOfIdenticalRequestsSpreads: a burst of one shared long prompt does not pile
// onto the first worker that speculatively holds it: once its queued prefill costs more
// than recomputing elsewhere, the next copies go elsewhere.
func TestBurstOfIdenticalRequestsSpreads(t *testing.T) {
	r, _ := stand(t, 4, scoring.PolicyKVRoute)
	count := map[string]int{}
	toks := tokens(7, 4096)
	for i := 0; i < 16; i++ {
		tk, err := r.Pick(context.Background(), completion(toks), router.PickOptions{})
		if err != nil {
			t.Fatal(err)
		}
		count[tk.Worker]++
	}
	if len(count) < 4 {
		t.Fatalf("a burst of one hot prompt must spread over every idle worker, got %v", count)
	}
	for w, n := range count {
		if n > 8 {
			t.Fatalf("%s took %d of 16 identical requests: %v", w, n, count)
		}
	}
}

// TestWarmPrefixFollowedWhenIdle: after the burst drained (first tokens seen), a request
// sharing the prefix goes to a worker holding it.
func TestWarmPrefixFollowedWhenIdle(t *testing.T) {
	r, ix := stand(t, 4, scoring.PolicyKVRoute)
	toks := tokens(3, 4096)
	tk, err := r.Pick(context.Background(), completion(toks), router.PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tk.FirstToken(time.Time{})
	tk.Done(200, responseUsage(), time.Time{})
	next := append(append([]uint32{}, toks...), 1, 2, 3)
	tk2, err := r.Pick(context.Background(), completion(next), router.PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tk2.Worker != tk.Worker || tk2.CachedTokens != 4096 {
		t.Fatalf("the idle worker holding the prefix must win: first %s, then %s (cached %d)", tk.Worker, tk2.Worker, tk2.CachedTokens)
	}
	_ = ix
}

func responseUsage() (u response.Usage) { return }
