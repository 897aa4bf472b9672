package scoring_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// BenchmarkPick times one Policy.Pick over 64 candidates for a 2,048-block prompt
// (32,768 tokens at block size 16); candidate i holds i×32 leading blocks, a quarter
// have booked prefill and running decodes, half have a fresh scraped load. Index lookup
// and tokenization are excluded (BenchmarkRouterPick includes the lookup).
// Target for kvroute: ≤ 100 µs.
func BenchmarkPick(b *testing.B) {
	const nw, blocks, bs = 64, 2048, 16
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	toks := make([]uint32, blocks*bs)
	for i := range toks {
		toks[i] = uint32(i)
	}
	cs := make([]scoring.Candidate, nw)
	for i := range cs {
		name := fmt.Sprintf("w%02d", i)
		c := scoring.Candidate{Worker: &workers.Worker{Name: name, Address: name}}
		c.Cached = kvindex.Match{Worker: name, Blocks: i * 32}
		c.Cached.ByTier[kvindex.TierGPU] = i * 32
		c.CachedTokens = min(i*32*bs, blocks*bs-1)
		if i%4 == 0 {
			c.Booked = scoring.Booked{Requests: 5, Prefilling: 2, PrefillTokens: 6000, Decoding: 3}
		}
		if i%2 == 0 {
			c.Load = workers.Load{Waiting: 2, Running: 8, KVUsage: 0.5, ScrapedAt: now.Add(-time.Second)}
		}
		cs[i] = c
	}
	for _, name := range scoring.PolicyNames {
		b.Run(fmt.Sprintf("policy=%s/workers=%d/blocks=%d", name, nw, blocks), func(b *testing.B) {
			p, _ := scoring.New(name, scoring.Options{Rand: rand.New(rand.NewPCG(1, 1))})
			in := &scoring.Input{Model: "m", PromptTokens: len(toks), Tokens: toks, BlockSize: bs, Now: now}
			b.ReportAllocs()
			for b.Loop() {
				p.Pick(in, cs)
			}
		})
	}
}

// BenchmarkRouterPick times router.Pick end to end minus tokenization (the prompt comes
// as token ids): block hashing (2,048 keys), kvindex lookup over 64 workers each holding
// a different share of the prefix, kvroute's prediction and the booking. Each ticket is
// released right away so the load stays constant.
func BenchmarkRouterPick(b *testing.B) {
	const nw, blocks, bs = 64, 2048, 16
	r, ix := stand(b, nw, scoring.PolicyKVRoute)
	toks := tokens(1, blocks*bs)
	keys := kvindex.HashBlocks(kvindex.Namespace{Model: "m"}.Seed(), toks, bs, nil)
	for i := 0; i < nw; i++ {
		ix.Store(fmt.Sprintf("w%02d", i), kvindex.TierGPU, keys[:i*32])
	}
	req := completion(toks)
	b.ReportAllocs()
	for b.Loop() {
		tk, err := r.Pick(context.Background(), req, router.PickOptions{RequestID: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		tk.Abort()
	}
}
