package bench

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/sim"
)

func smallProfile() sim.Profile {
	return sim.Profile{Name: "small", Model: "m", StepOverhead: 10 * time.Millisecond, PrefillPerToken: 200 * time.Microsecond,
		DecodePerSeq: time.Millisecond, BlockSize: 16, NumBlocks: 300, MaxNumSeqs: 32, MaxBatchTokens: 512}
}

func TestVirtualClusterRoutesByPrefixAndIsDeterministic(t *testing.T) {
	w := SharedPrefix(SharedPrefixOptions{Prefixes: 6, PrefixTokens: 1500, SuffixTokens: 50, OutputTokens: 8, Requests: 200, Seed: 2})
	arr := Arrivals{Kind: "poisson", Rate: 4, Seed: 2}
	wl := arr.Apply(w)
	bound := HitBound(wl, 16)
	run := func(policy string) Summary {
		rs, err := RunVirtual(wl, VirtualOptions{Workers: 3, Profile: smallProfile(), Policy: policy, Arrivals: arr, Seed: 2, EventLag: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return Summarize(policy, arr.String(), rs, 8*time.Second, bound, WorkerNames(3))
	}
	kv, rnd := run("kvroute"), run("random")
	t.Logf("kvroute p50 %.3f hit %.2f; random p50 %.3f hit %.2f; bound %.2f", kv.TTFTp50, kv.HitRatio, rnd.TTFTp50, rnd.HitRatio, bound)
	if kv.Errors != 0 || kv.Requests != 200 {
		t.Fatalf("errors %d", kv.Errors)
	}
	if kv.HitRatio < rnd.HitRatio+0.1 || kv.TTFTp50 >= rnd.TTFTp50 {
		t.Errorf("kvroute (hit %.2f p50 %.3f) not better than random (hit %.2f p50 %.3f)", kv.HitRatio, kv.TTFTp50, rnd.HitRatio, rnd.TTFTp50)
	}
	if kv.HitRatio > bound+1e-9 {
		t.Errorf("hit ratio %.3f above its bound %.3f", kv.HitRatio, bound)
	}
	if again := run("kvroute"); again.TTFTp50 != kv.TTFTp50 || again.HitRatio != kv.HitRatio {
		t.Error("virtual runs are not deterministic")
	}
	if _, err := RunVirtual(wl, VirtualOptions{Workers: 3, Profile: smallProfile(), Policy: "no-such-policy"}); err == nil {
		t.Error("unknown policy accepted")
	}
	if _, err := RunVirtual(wl, VirtualOptions{Profile: smallProfile(), Policy: "random"}); err == nil {
		t.Error("zero workers accepted")
	}
}

func TestVirtualStreamsRunConversationsInOrder(t *testing.T) {
	w := MultiTurn(MultiTurnOptions{Conversations: 6, Turns: 3, SystemTokens: 200, UserTokens: 40, OutputTokens: 8, Think: 100 * time.Millisecond, Seed: 1})
	arr := Arrivals{Kind: "streams", Streams: 2}
	rs, err := RunVirtual(arr.Apply(w), VirtualOptions{Workers: 2, Profile: smallProfile(), Policy: "kvroute", Arrivals: arr})
	if err != nil {
		t.Fatal(err)
	}
	for i, it := range w.Items {
		if rs[i].Err != "" || rs[i].E2E == 0 {
			t.Fatalf("item %d: %+v", i, rs[i])
		}
		if it.Turn > 0 {
			prev := rs[i-1]
			if rs[i].Start < prev.Start+prev.E2E+it.Think {
				t.Errorf("conv %d turn %d started before the previous turn ended + think", it.Conv, it.Turn)
			}
			if rs[i].CachedTokens == 0 {
				t.Errorf("conv %d turn %d: no prefix reuse from the previous turn", it.Conv, it.Turn)
			}
		}
	}
}

func TestStoreFeeder(t *testing.T) {
	ix := kvindex.New(kvindex.Options{})
	seed := kvindex.Namespace{Model: "m"}.Seed()
	f := &StoreFeeder{Index: ix, Seed: seed}
	toks := seq(0, 48)
	keys := kvindex.HashBlocks(seed, toks, 16, nil)
	f.Apply("w", sim.Batch{Events: []sim.Event{
		{Kind: sim.BlockStored, Hashes: []uint64{11, 12}, Tokens: toks[:32], BlockSize: 16},
		{Kind: sim.BlockStored, Hashes: []uint64{13}, HasParent: true, Parent: 12, Tokens: toks[32:48], BlockSize: 16},
		{Kind: sim.BlockStored, Hashes: []uint64{99}, HasParent: true, Parent: 77, Tokens: toks[:16], BlockSize: 16}, // unknown parent: skipped
	}})
	if m := ix.Lookup(keys, nil); len(m) != 1 || m[0].Blocks != 3 {
		t.Fatalf("lookup %+v", m)
	}
	// Stored twice, removed once: still held.
	f.Apply("w", sim.Batch{Events: []sim.Event{{Kind: sim.BlockStored, Hashes: []uint64{13}, HasParent: true, Parent: 12, Tokens: toks[32:48], BlockSize: 16}}})
	f.Apply("w", sim.Batch{Events: []sim.Event{{Kind: sim.BlockRemoved, Hashes: []uint64{13, 404}}}})
	if m := ix.Lookup(keys, nil); m[0].Blocks != 3 {
		t.Fatalf("after one of two removals: %+v", m)
	}
	f.Apply("w", sim.Batch{Events: []sim.Event{{Kind: sim.BlockRemoved, Hashes: []uint64{13}}}})
	if m := ix.Lookup(keys, nil); m[0].Blocks != 2 {
		t.Fatalf("after removal: %+v", m)
	}
	f.Apply("w", sim.Batch{Events: []sim.Event{{Kind: sim.AllBlocksCleared}}})
	if m := ix.Lookup(keys, nil); len(m) != 0 {
		t.Fatalf("after clear: %+v", m)
	}
}

// Replicas in virtual time: arrivals spread over 3 kvroute replicas (the shared-prefix
// rows' workload: 8 × 6,000-token prefixes, 3 × l40s-27b, 4 req/s). Sharing bookings
// (package peers' exchange, 25 ms, 5 ms in transit) keeps p90 TTFT and the cache hit
// within 5 % of one replica; blind replicas prefill prefixes more often (duplicate
// cold prefills) and lose p90. (Not true of every workload: BENCHMARKS.md "Replicas"
// records a cache-starved one where sharing replicas do worse than one.)
func TestVirtualReplicasShareOrDuplicate(t *testing.T) {
	prof, err := sim.LookupProfile("l40s-27b")
	if err != nil {
		t.Fatal(err)
	}
	w := SharedPrefix(SharedPrefixOptions{Prefixes: 8, PrefixTokens: 6000, SuffixTokens: 200, OutputTokens: 64, Requests: 200, Seed: 1})
	arr := Arrivals{Kind: "poisson", Rate: 4, Seed: 1}
	wl := arr.Apply(w)
	bound := HitBound(wl, prof.BlockSize)
	run := func(replicas int, share bool) (Summary, int) {
		rs, err := RunVirtual(wl, VirtualOptions{Workers: 3, Profile: prof, Policy: "kvroute", Arrivals: arr, Seed: 1,
			EventLag: 5 * time.Millisecond, Replicas: replicas, Share: share, ExchangeDelay: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return Summarize("kvroute", arr.String(), rs, 8*time.Second, bound, WorkerNames(3)), ExtraPrefillTokens(rs, bound)
	}
	one, oneX := run(1, false)
	shared, sharedX := run(3, true)
	blind, blindX := run(3, false)
	t.Logf("p90/hit/extra prefill tokens: 1 replica %.3f/%.3f/%d, 3 shared %.3f/%.3f/%d, 3 blind %.3f/%.3f/%d",
		one.TTFTp90, one.HitRatio, oneX, shared.TTFTp90, shared.HitRatio, sharedX, blind.TTFTp90, blind.HitRatio, blindX)
	for _, s := range []Summary{one, shared, blind} {
		if s.Errors != 0 || s.Requests != 200 {
			t.Fatalf("errors %d of %d", s.Errors, s.Requests)
		}
	}
	if shared.HitRatio < 0.95*one.HitRatio || shared.TTFTp90 > 1.05*one.TTFTp90 {
		t.Errorf("3 sharing replicas p90 %.3f hit %.3f, one replica p90 %.3f hit %.3f: not within 5 %%", shared.TTFTp90, shared.HitRatio, one.TTFTp90, one.HitRatio)
	}
	if blindX <= sharedX || blind.TTFTp90 <= shared.TTFTp90 {
		t.Errorf("blind replicas: %d extra prefill tokens, p90 %.3f; sharing ones %d, %.3f: no duplicates shown", blindX, blind.TTFTp90, sharedX, shared.TTFTp90)
	}
	if _, err := RunVirtual(wl, VirtualOptions{Workers: 3, Profile: prof, PolicyImpl: mustPolicy(t), Replicas: 2}); err == nil {
		t.Error("one PolicyImpl shared by 2 replicas accepted (its learned state would be shared)")
	}
}

func mustPolicy(t *testing.T) scoring.Policy {
	p, err := newPolicy("random", scoring.Options{Rand: rand.New(rand.NewPCG(1, 2)), BatchTokens: 2048})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
