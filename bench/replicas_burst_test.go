package bench

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/sim"
)

// A burst of 120 requests for one new 4,000-token prefix within ~60 ms over 4
// l40s-27b workers (the process test's burst, in virtual time): one replica and 3
// blind ones spread it 30/30/30/30, and so do 3 sharing replicas whose summaries reach
// the peers before their next pick (ExchangeSync, with or without PeerState), and 3
// sharing replicas on the real exchange (leading edge, 25 ms, 5 ms transit), which
// herded (38/8/51/23) while a receiver counted every peer's cold prefill of the same
// prefix on a worker in full (router.PeerWorker.DuplicateBlocks): replicas that each
// sent a request there within one exchange lag then made the worker look several
// prefills deep, and every replica piled onto the one worker that had only one.
func TestVirtualReplicaBurstSpread(t *testing.T) {
	prof, err := sim.LookupProfile("l40s-27b")
	if err != nil {
		t.Fatal(err)
	}
	w := SharedPrefix(SharedPrefixOptions{Prefixes: 1, PrefixTokens: 4000, SuffixTokens: 50, OutputTokens: 32, Requests: 120, Seed: 1})
	arr := Arrivals{Kind: "poisson", Rate: 2000, Seed: 1}
	wl := arr.Apply(w)
	var one float64 // one replica's TTFT p90, seconds (the first case)
	for _, c := range []struct {
		n                 int
		share, sync, peer bool
	}{{1, false, false, false}, {3, true, false, false}, {3, false, false, false},
		{3, true, true, false}, {3, true, true, true}} {
		rs, err := RunVirtual(wl, VirtualOptions{Workers: 4, Profile: prof, Policy: "kvroute", Arrivals: arr, Seed: 1,
			EventLag: 5 * time.Millisecond, Replicas: c.n, Share: c.share, ExchangeDelay: 5 * time.Millisecond, ExchangeSync: c.sync, PeerState: c.peer})
		if err != nil {
			t.Fatal(err)
		}
		per := map[string]int{}
		most := 0
		for _, r := range rs {
			if r.Err != "" {
				t.Fatalf("request error %s", r.Err)
			}
			per[r.Worker]++
			most = max(most, per[r.Worker])
		}
		s := Summarize("kvroute", arr.String(), rs, 8*time.Second, 1, WorkerNames(4))
		t.Logf("replicas %d shared %v sync %v peer-state %v: per worker %v, TTFT p90 %.2f s", c.n, c.share, c.sync, c.peer, per, s.TTFTp90)
		if c.n == 1 {
			one = s.TTFTp90
		} else if s.TTFTp90 > 1.1*one {
			t.Errorf("replicas %d shared %v: TTFT p90 %.2f s, want within 10 %% of one replica's %.2f s", c.n, c.share, s.TTFTp90, one)
		}
		if most > 45 {
			t.Errorf("replicas %d shared %v: %d of 120 on one worker, want ≤ 45 (one replica: 30)", c.n, c.share, most)
		}
	}
}
