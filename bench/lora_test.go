package bench

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/sim"
)

func TestLoRAWorkloadZipf(t *testing.T) {
	w := LoRA(LoRAOptions{Adapters: 16, Skew: 1.1, SystemTokens: 32, UserTokens: 8, OutputTokens: 4, Requests: 400, Seed: 1})
	counts := map[string]int{}
	for _, it := range w.Items {
		if it.Adapter == "" || it.Messages[0].Role != "system" {
			t.Fatalf("item without adapter or system prompt: %+v", it)
		}
		counts[it.Adapter]++
	}
	if counts[AdapterName(0)] <= counts[AdapterName(8)] || len(w.Adapters()) < 8 {
		t.Fatalf("Zipf popularity: %v", counts)
	}
}

// A virtual LoRA run goes through the router with each adapter a model of the base,
// the engines load adapters into max_loras slots, and the index matches an adapter's
// blocks (its system prompt) for later requests of that adapter.
func TestVirtualLoRARun(t *testing.T) {
	prof, err := sim.LookupProfile("h100-8b")
	if err != nil {
		t.Fatal(err)
	}
	prof.MaxLoRAs, prof.LoRALoadTime = 2, 200*time.Millisecond
	w := LoRA(LoRAOptions{Adapters: 6, Skew: 1.1, SystemTokens: 512, UserTokens: 32, OutputTokens: 8, Requests: 120, Seed: 3})
	a, _ := ParseArrivals("poisson:4", 3)
	w = a.Apply(w)
	for _, pol := range LoRAPolicies {
		rs, err := RunVirtual(w, VirtualOptions{Workers: 3, Profile: prof, Policy: pol, Arrivals: a, Seed: 3})
		if err != nil {
			t.Fatal(err)
		}
		s := Summarize(pol, a.String(), rs, 8*time.Second, 0, WorkerNames(3))
		if s.Errors != 0 {
			t.Fatalf("%s: %d errors", pol, s.Errors)
		}
		if loads := s.AdapterLoadsPer1k * float64(len(rs)) / 1000; loads < float64(len(w.Adapters())) {
			t.Fatalf("%s: %.0f adapter loads for %d adapters: each must load at least once", pol, loads, len(w.Adapters()))
		}
		if s.HitRatio < 0.5 {
			t.Fatalf("%s: hit ratio %.2f: adapter system prompts were not reused", pol, s.HitRatio)
		}
		if pol == "kvroute" && s.PredMedRel > 0.5 {
			t.Fatalf("kvroute's median prediction error %.2f: the adapter term or the index is off", s.PredMedRel)
		}
	}
}
