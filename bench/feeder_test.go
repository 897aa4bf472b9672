package bench

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/sim"
)

// TestWireFeederMatchesStoreFeeder: the same deterministic virtual run, its KV events
// fed once as vLLM wire payloads (the default) and once through Store/Remove, routes
// every request to the same worker with the same cache hits. The small block capacity
// (300 blocks for prompts of ~100 blocks) makes engines evict, so removals count too.
func TestWireFeederMatchesStoreFeeder(t *testing.T) {
	w := SharedPrefix(SharedPrefixOptions{Prefixes: 6, PrefixTokens: 1500, SuffixTokens: 50, OutputTokens: 8, Requests: 150, Seed: 3})
	arr := Arrivals{Kind: "poisson", Rate: 4, Seed: 3}
	wl := arr.Apply(w)
	var wire *WireFeeder
	run := func(newFeeder func(*kvindex.Index, kvindex.Key) IndexFeeder) []Result {
		rs, err := RunVirtual(wl, VirtualOptions{Workers: 3, Profile: smallProfile(), Policy: "kvroute", Arrivals: arr, Seed: 3,
			EventLag: 5 * time.Millisecond, NewFeeder: newFeeder})
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	viaWire := run(func(ix *kvindex.Index, _ kvindex.Key) IndexFeeder {
		wire = &WireFeeder{Index: ix, Model: smallProfile().Model}
		return wire
	})
	viaStore := run(NewStoreFeeder)
	if wire.Errors != 0 {
		t.Fatalf("%d payloads rejected", wire.Errors)
	}
	hits := 0
	for i := range viaWire {
		a, b := viaWire[i], viaStore[i]
		if a.Worker != b.Worker || a.CachedTokens != b.CachedTokens || a.TTFT != b.TTFT {
			t.Fatalf("request %d: wire %s cached %d ttft %v; store %s cached %d ttft %v",
				i, a.Worker, a.CachedTokens, a.TTFT, b.Worker, b.CachedTokens, b.TTFT)
		}
		hits += a.CachedTokens
	}
	if hits == 0 {
		t.Fatal("no cache hits: the comparison says nothing")
	}
	if def := run(nil); def[len(def)-1] != viaWire[len(viaWire)-1] {
		t.Errorf("default feeder differs from WireFeeder: %+v vs %+v", def[len(def)-1], viaWire[len(viaWire)-1])
	}
}

// TestWireFeederAppliesEvents: stores (chained by parent), a duplicate store, removals
// and a clear reach the index through the wire path, as in TestStoreFeeder.
func TestWireFeederAppliesEvents(t *testing.T) {
	ix := kvindex.New(kvindex.Options{Models: []kvindex.Model{{Name: "m", BlockSize: 16}}})
	f := &WireFeeder{Index: ix, Model: "m", Encoder: sim.ArrayEncoder{}}
	toks := seq(0, 48)
	keys := kvindex.HashBlocks(kvindex.Namespace{Model: "m"}.Seed(), toks, 16, nil)
	f.Apply("w", sim.Batch{Events: []sim.Event{
		{Kind: sim.BlockStored, Hashes: []uint64{11, 12}, Tokens: toks[:32], BlockSize: 16, Medium: "GPU"},
		{Kind: sim.BlockStored, Hashes: []uint64{13}, HasParent: true, Parent: 12, Tokens: toks[32:48], BlockSize: 16, Medium: "GPU"},
	}})
	if m := ix.Lookup(keys, nil); len(m) != 1 || m[0].Blocks != 3 {
		t.Fatalf("lookup %+v", m)
	}
	f.Apply("w", sim.Batch{Events: []sim.Event{{Kind: sim.BlockStored, Hashes: []uint64{13}, HasParent: true, Parent: 12, Tokens: toks[32:48], BlockSize: 16, Medium: "GPU"}}})
	f.Apply("w", sim.Batch{Events: []sim.Event{{Kind: sim.BlockRemoved, Hashes: []uint64{13}, Medium: "GPU"}}})
	if m := ix.Lookup(keys, nil); m[0].Blocks != 3 {
		t.Fatalf("after one of two removals: %+v", m)
	}
	f.Apply("w", sim.Batch{Events: []sim.Event{{Kind: sim.BlockRemoved, Hashes: []uint64{13}, Medium: "GPU"}}})
	if m := ix.Lookup(keys, nil); m[0].Blocks != 2 {
		t.Fatalf("after removal: %+v", m)
	}
	f.Apply("w", sim.Batch{Events: []sim.Event{{Kind: sim.AllBlocksCleared}}})
	if m := ix.Lookup(keys, nil); len(m) != 0 {
		t.Fatalf("after clear: %+v", m)
	}
	if f.Errors != 0 {
		t.Fatalf("%d payloads rejected", f.Errors)
	}
	if s, ok := ix.Summary("w"); !ok || s.Mode != "exact" {
		t.Fatalf("summary %+v", s)
	}
}
