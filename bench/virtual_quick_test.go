package bench

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/sim"
)

func TestVirtualQuick(t *testing.T) {
	w := SharedPrefix(SharedPrefixOptions{Prefixes: 8, PrefixTokens: 6000, SuffixTokens: 200, OutputTokens: 64, Requests: 300, Seed: 1})
	for _, rate := range []float64{0.5, 1, 2} {
		a := Arrivals{Kind: "poisson", Rate: rate, Seed: 1}
		wl := a.Apply(w)
		bound := HitBound(wl, 16)
		for _, p := range PolicyNames() {
			start := time.Now()
			rs, err := RunVirtual(wl, VirtualOptions{Workers: 3, Profile: sim.Profiles["l40s-27b"], Policy: p, Arrivals: a, Seed: 1})
			if err != nil {
				t.Log(err)
				continue
			}
			s := Summarize(p, a.String(), rs, 8*time.Second, bound, WorkerNames(3))
			t.Logf("rate %.1f %-10s p50 %.2f p90 %.2f p99 %.2f hit %.2f bound %.2f goodput %.1f cv %.2f mae %.2f (%v)", rate, p, s.TTFTp50, s.TTFTp90, s.TTFTp99, s.HitRatio, s.HitBound, s.Goodput, s.LoadCV, s.PredMAE, time.Since(start))
		}
	}
}
