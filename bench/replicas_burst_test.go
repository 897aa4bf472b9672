package bench

import (
	"os"
	"testing"
	"time"

	"github.com/kvroute/kvroute/sim"
)

// A burst of 120 requests for one new 4,000-token prefix within ~60 ms over 4
// l40s-27b workers (the process test's burst, in virtual time): one replica and 3
// blind ones spread it 30/30/30/30; 3 sharing replicas herd (BENCHMARKS.md
// "Replicas"). The spread is asserted only with KVROUTE_REPLICA_SPREAD=1 (it fails
// today), as in e2e TestReplicaProcesses.
func TestVirtualReplicaBurstSpread(t *testing.T) {
	prof, err := sim.LookupProfile("l40s-27b")
	if err != nil {
		t.Fatal(err)
	}
	w := SharedPrefix(SharedPrefixOptions{Prefixes: 1, PrefixTokens: 4000, SuffixTokens: 50, OutputTokens: 32, Requests: 120, Seed: 1})
	arr := Arrivals{Kind: "poisson", Rate: 2000, Seed: 1}
	wl := arr.Apply(w)
	for _, c := range []struct {
		n     int
		share bool
	}{{1, false}, {3, true}, {3, false}} {
		rs, err := RunVirtual(wl, VirtualOptions{Workers: 4, Profile: prof, Policy: "kvroute", Arrivals: arr, Seed: 1,
			EventLag: 5 * time.Millisecond, Replicas: c.n, Share: c.share, ExchangeDelay: 5 * time.Millisecond})
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
		t.Logf("replicas %d shared %v: per worker %v, TTFT p90 %.2f s", c.n, c.share, per, s.TTFTp90)
		if os.Getenv("KVROUTE_REPLICA_SPREAD") == "1" && most > 45 {
			t.Errorf("replicas %d shared %v: %d of 120 on one worker, want ≤ 45 (one replica: 30)", c.n, c.share, most)
		}
	}
}
