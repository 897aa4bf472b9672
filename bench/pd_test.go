package bench

import (
	"testing"

	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workers"
)

func pdRun(t *testing.T, policy string, roles []workers.Role, o PDOptions, arrivals string) []Result {
	t.Helper()
	prof, err := sim.LookupProfile("h100-8b")
	if err != nil {
		t.Fatal(err)
	}
	PDProfile(&prof)
	a, err := ParseArrivals(arrivals, 1)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := RunVirtual(a.Apply(PD(o)), VirtualOptions{Workers: len(roles), Profile: prof, Policy: policy, Arrivals: a, Seed: 1, Roles: roles})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// A P/D fleet in virtual time: long prompts are prefilled on prefill workers and
// decoded on decode workers, every request completes, and the decode's first token
// comes after the prefill and the KV read (TTFT above the prefill alone).
func TestVirtualPDLongPrompts(t *testing.T) {
	roles := pdRoles(2, 2, workers.RoleDecode)
	o := PDOptions{Requests: 40, PromptMin: 8192, PromptMax: 16384, OutputMin: 16, OutputMax: 32, Docs: 4, DocShare: 0.5}
	for _, pol := range []string{"kvroute", "llmd_pd"} {
		rs := pdRun(t, pol, roles, o, "poisson:0.5")
		remote := 0
		for _, r := range rs {
			if r.Err != "" || r.TTFT <= 0 || r.OutputTokens < 16 {
				t.Fatalf("%s: request %d: err %q, TTFT %v, %d output tokens", pol, r.Index, r.Err, r.TTFT, r.OutputTokens)
			}
			if r.Worker != "w02" && r.Worker != "w03" {
				t.Fatalf("%s: request %d answered by %s, a prefill worker", pol, r.Index, r.Worker)
			}
			if r.PrefillWorker != "" {
				remote++
				if r.PrefillWorker != "w00" && r.PrefillWorker != "w01" {
					t.Fatalf("%s: request %d prefilled on %s", pol, r.Index, r.PrefillWorker)
				}
			}
		}
		if remote != len(rs) {
			t.Fatalf("%s: %d of %d prompts of 8k–16k tokens prefilled remotely, want all (past the local caps)", pol, remote, len(rs))
		}
	}
}

// Short prompts on both-role workers: kvroute prefills nearly all of them where they
// are decoded (a remote prefill adds a request overhead and a transfer), while llm-d's
// decider disaggregates every prompt whose uncached part is past its 1,024-token
// threshold (most of them: a quarter of each prompt is a shared document).
func TestVirtualPDShortPromptsLocal(t *testing.T) {
	roles := pdRoles(0, 4, workers.RoleBoth)
	o := PDOptions{Requests: 80, PromptMin: 1200, PromptMax: 2048, OutputMin: 16, OutputMax: 32, Docs: 4, DocShare: 0.25}
	count := func(rs []Result) int {
		n := 0
		for _, r := range rs {
			if r.Err != "" {
				t.Fatalf("request %d: %s", r.Index, r.Err)
			}
			if r.PrefillWorker != "" {
				n++
			}
		}
		return n
	}
	if kv, ll := count(pdRun(t, "kvroute", roles, o, "poisson:4")), count(pdRun(t, "llmd_pd", roles, o, "poisson:4")); kv > len(roles) || ll < 60 {
		t.Fatalf("remote prefills: kvroute %d, llmd_pd %d of 80; want kvroute ≤ 4, llmd_pd ≥ 60", kv, ll)
	}
}
