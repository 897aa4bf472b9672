package router

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// Concurrent picks each work in their own scratch (pickScratch, scoring.Scratch): every
// ticket carries its own request's cached prefix, prompt length, prediction and
// fallbacks, whatever the other picks in flight at the same time hold. Each request is
// one of 6 prefixes of different lengths, stored on every worker, plus a suffix no
// other request has, so its cached tokens are its prefix's length on whichever worker
// it lands. Run under -race, a scratch shared by two picks is also a reported race.
func TestConcurrentPicksKeepTheirOwnScratch(t *testing.T) {
	const nw, prefixes, streams, picks = 12, 6, 8, 60
	reg := workers.NewRegistry()
	ws := make([]*workers.Worker, nw)
	for i := range ws {
		ws[i] = &workers.Worker{Name: fmt.Sprintf("w%02d", i), Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Models: []string{"m"}}
	}
	reg.Set(ws)
	idx := kvindex.New(kvindex.Options{SpeculativeTTL: time.Hour})
	pol, err := scoring.New(scoring.PolicyKVRoute, scoring.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := New(Options{Registry: reg, Index: idx, Policy: pol, Models: []Model{{Name: "m", BlockSize: 16}}, Metrics: metrics.NewUnregistered()})
	seed := kvindex.Namespace{Model: "m"}.Seed()
	prefix := make([][]uint32, prefixes)
	for p := range prefix {
		prefix[p] = make([]uint32, (p+1)*64)
		for j := range prefix[p] {
			prefix[p][j] = uint32(p*1_000_003 + j)
		}
		for _, w := range ws {
			idx.Store(w.Name, kvindex.TierGPU, kvindex.HashBlocks(seed, prefix[p], 16, nil))
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for s := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range picks {
				p := (s + n) % prefixes
				ids := append(slices.Clone(prefix[p]), make([]uint32, 64)...)
				for j := len(prefix[p]); j < len(ids); j++ {
					ids[j] = uint32(500_000_000 + (s*picks+n)*64 + j)
				}
				req := &request.Request{API: request.APICompletions, Model: "m", PromptTokenIDs: [][]uint32{ids}}
				tk, err := r.Pick(context.Background(), req, PickOptions{Fallbacks: 3})
				if err != nil {
					errs <- err
					return
				}
				switch {
				case tk.CachedTokens != len(prefix[p]) || tk.PromptTokens != len(ids):
					errs <- fmt.Errorf("stream %d pick %d: cached %d of %d tokens, want %d of %d", s, n, tk.CachedTokens, tk.PromptTokens, len(prefix[p]), len(ids))
				case tk.Predicted.TTFT <= 0 || tk.Predicted.Prefill <= 0:
					errs <- fmt.Errorf("stream %d pick %d: prediction %+v", s, n, tk.Predicted)
				case len(tk.Fallbacks) != 3 || slices.Contains(tk.Fallbacks, tk.Address) || len(slices.Compact(slices.Sorted(slices.Values(tk.Fallbacks)))) != 3:
					errs <- fmt.Errorf("stream %d pick %d: fallbacks %v of %s", s, n, tk.Fallbacks, tk.Address)
				}
				tk.FirstToken(time.Time{})
				tk.Done(200, response.Usage{}, time.Time{})
				if len(errs) > 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A scratch reset for the pool keeps its arrays but points at nothing of the pick it served
// (no worker, request or tokens kept alive by the pool).
func TestScratchResetDropsReferences(t *testing.T) {
	sc := &pickScratch{}
	w := &workers.Worker{Name: "w"}
	sc.ws = append(sc.ws, w, w)
	sc.cands = append(sc.cands, scoring.Candidate{Worker: w, Cached: kvindex.Match{Worker: "w"}})
	sc.loads = append(sc.loads, workers.Load{ScrapedAt: time.Now()})
	sc.matches = append(sc.matches, kvindex.Match{Worker: "w"})
	sc.in.Request = &request.Request{}
	sc.in.Tokens = []uint32{1}
	sc.reset()
	if sc.ws[0] != nil || sc.ws[1] != nil || sc.cands[0].Worker != nil || sc.cands[0].Cached.Worker != "" ||
		!sc.loads[0].ScrapedAt.IsZero() || sc.matches[0].Worker != "" || sc.in.Request != nil || sc.in.Tokens != nil {
		t.Fatalf("scratch still refers to its pick: %+v", sc)
	}
	if cap(sc.cands) == 0 || cap(sc.ws) < 2 {
		t.Fatal("scratch lost its arrays")
	}
}
