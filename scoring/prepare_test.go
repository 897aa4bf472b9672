package scoring_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// Prepare (without the router lock, on stale bookings) followed by Pick decides
// exactly as Pick alone on the current bookings: a prediction made from a Booked that
// changed since is recomputed.
func TestPreparedPickEqualsPick(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cands := func() []scoring.Candidate {
		cs := make([]scoring.Candidate, 8)
		for i := range cs {
			name := fmt.Sprintf("w%d", i)
			cs[i] = scoring.Candidate{Worker: &workers.Worker{Name: name}, Cached: kvindex.Match{Worker: name, Blocks: 8 * i}, CachedTokens: 8 * i * 16}
			cs[i].Cached.ByTier[kvindex.TierGPU] = 8 * i
		}
		return cs
	}
	newPolicy := func() scoring.Policy {
		p, err := scoring.New(scoring.PolicyKVRoute, scoring.Options{Rand: rand.New(rand.NewPCG(1, 2))})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for round := 0; round < 3; round++ {
		// Fresh policies per round: the scoring model's own backlog estimate (set by the
		// previous round's pick) would otherwise decide, not the Booked this test varies.
		plain, staged := newPolicy(), newPolicy()
		in := func() *scoring.Input {
			return &scoring.Input{Model: "m", PromptTokens: 2048, BlockSize: 16, Now: now.Add(time.Duration(round) * time.Second)}
		}
		stale, cur := cands(), cands()
		// Since Prepare, w7 (the longest prefix, the plain winner without bookings) got
		// a deep queue: the current decision must not be made on the stale prediction.
		cur[7].Booked = scoring.Booked{Requests: 4, Prefilling: 4, PrefillTokens: 400_000}
		want := plain.Pick(in(), cur)
		sin := in()
		staged.(scoring.Preparer).Prepare(sin, stale)
		got := staged.Pick(sin, cur)
		if got.Index != want.Index || got.Reason != want.Reason || len(got.Predictions) != len(want.Predictions) {
			t.Fatalf("round %d: prepared pick %d (%s), plain pick %d (%s)", round, got.Index, got.Reason, want.Index, want.Reason)
		}
		for i := range want.Predictions {
			if got.Predictions[i].TTFT != want.Predictions[i].TTFT {
				t.Fatalf("round %d: candidate %d predicted %v prepared, %v plain", round, i, got.Predictions[i].TTFT, want.Predictions[i].TTFT)
			}
		}
		if want.Index == 7 {
			t.Fatalf("round %d: the deep-queued worker won; the test does not exercise the recompute", round)
		}
	}
}
