package bench

import (
	"testing"
	"time"
)

// The cache-starved case of BENCHMARKS.md "Replicas" (300 KV blocks per worker, 6 ×
// 1,500-token prefixes, 64 output tokens, 12 req/s, seed 3): 3 replicas sharing bookings
// every 25 ms (5 ms in transit) stay within 5 % of one replica on p90 TTFT and cache
// hit. With a fixed 25 ms exchange tick (every change waited up to a tick) they reached
// p90 1.57 s vs 0.054 s, hit 91.0 vs 93.3 %: a request for a new prefix routed on one
// replica was invisible to the others for up to the tick, which sent the next request
// for it elsewhere (a duplicate cold prefill that, at 300 blocks, evicts other prefixes).
func TestVirtualReplicasCacheStarved(t *testing.T) {
	w := SharedPrefix(SharedPrefixOptions{Prefixes: 6, PrefixTokens: 1500, SuffixTokens: 50, OutputTokens: 64, Requests: 200, Seed: 3})
	arr := Arrivals{Kind: "poisson", Rate: 12, Seed: 3}
	wl := arr.Apply(w)
	bound := HitBound(wl, 16)
	run := func(replicas int, share bool) Summary {
		rs, err := RunVirtual(wl, VirtualOptions{Workers: 3, Profile: smallProfile(), Policy: "kvroute", Arrivals: arr, Seed: 3,
			EventLag: 5 * time.Millisecond, Replicas: replicas, Share: share, ExchangeDelay: 5 * time.Millisecond,
			ExchangeInterval: 25 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return Summarize("kvroute", arr.String(), rs, 8*time.Second, bound, WorkerNames(3))
	}
	one, shared := run(1, false), run(3, true)
	t.Logf("p90/hit: 1 replica %.3f/%.3f, 3 shared %.3f/%.3f", one.TTFTp90, one.HitRatio, shared.TTFTp90, shared.HitRatio)
	if shared.Errors != 0 || shared.Requests != 200 {
		t.Fatalf("errors %d of %d", shared.Errors, shared.Requests)
	}
	if shared.HitRatio < 0.95*one.HitRatio || shared.TTFTp90 > 1.05*one.TTFTp90 {
		t.Errorf("3 sharing replicas p90 %.3f hit %.3f, one replica p90 %.3f hit %.3f: not within 5 %%",
			shared.TTFTp90, shared.HitRatio, one.TTFTp90, one.HitRatio)
	}
}
