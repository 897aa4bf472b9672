package scoring

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/workers"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func seeded(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed)) }

// cand builds a candidate: name, cached GPU tokens (block size 16), booked uncached tokens.
func cand(name string, cachedTokens, bookedTokens int) Candidate {
	c := Candidate{Worker: &workers.Worker{Name: name, Address: name}, CachedTokens: cachedTokens}
	if cachedTokens > 0 {
		c.Cached = kvindex.Match{Worker: name, Blocks: (cachedTokens + 15) / 16}
		c.Cached.ByTier[kvindex.TierGPU] = c.Cached.Blocks
	}
	if bookedTokens > 0 {
		c.Booked = Booked{Requests: 1, Prefilling: 1, PrefillTokens: bookedTokens}
	}
	return c
}

func cands(n int) []Candidate {
	out := make([]Candidate, n)
	for i := range out {
		out[i] = cand(fmt.Sprintf("w%02d", i), 0, 0)
	}
	return out
}

func input(prompt int) *Input {
	return &Input{RequestID: "r", Model: "m", PromptTokens: prompt, BlockSize: 16, Now: t0}
}

func mustNew(name string, o Options) Policy {
	p, err := New(name, o)
	if err != nil {
		panic(err)
	}
	return p
}
