package bench

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workers"
)

// LoRAOptions describes a multi-adapter workload: Adapters LoRA adapters of one base
// model, each with its own system prompt (the adapter's task), requests drawing their
// adapter from a Zipf law of exponent Skew (adapter 0 the most popular), a unique user
// message and OutputTokens of output.
type LoRAOptions struct {
	Adapters     int
	Skew         float64 // > 1: Zipf exponent; ≤ 1: uniform
	SystemTokens int
	UserTokens   int
	OutputTokens int
	Requests     int
	Seed         uint64
}

// AdapterName is the name LoRA workloads give adapter i.
func AdapterName(i int) string { return fmt.Sprintf("lora-%02d", i) }

// LoRA builds the workload.
func LoRA(o LoRAOptions) *Workload {
	r := rand.New(rand.NewPCG(o.Seed, 0x10a))
	sys := make([][]uint32, o.Adapters)
	for i := range sys {
		sys[i] = randTokens(r, o.SystemTokens)
	}
	var z *rand.Zipf
	if o.Skew > 1 && o.Adapters > 1 {
		z = rand.NewZipf(r, o.Skew, 1, uint64(o.Adapters-1))
	}
	w := &Workload{Name: "lora"}
	for i := 0; i < o.Requests; i++ {
		k := r.IntN(max(o.Adapters, 1))
		if z != nil {
			k = int(z.Uint64())
		}
		w.Items = append(w.Items, Item{Conv: -1, MaxTokens: o.OutputTokens, Group: AdapterName(k), Adapter: AdapterName(k),
			Messages: []Message{{Role: "system", Tokens: sys[k]}, {Role: "user", Tokens: randTokens(r, o.UserTokens)}}})
	}
	return w
}

// Adapters returns the distinct LoRA adapters the workload's items name, sorted.
func (w *Workload) Adapters() []string {
	var out []string
	for i := range w.Items {
		if a := w.Items[i].Adapter; a != "" && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return out
}

// adapterModels configures each adapter as a model of the profile's base model (the
// router keys its blocks in the adapter's namespace and tokenizes with the base's).
func adapterModels(adapters []string, prof sim.Profile) []router.Model {
	out := make([]router.Model, len(adapters))
	for i, a := range adapters {
		out[i] = router.Model{Name: a, Base: prof.Model, BlockSize: prof.BlockSize}
	}
	return out
}

// scrapedAdapters is the engine's vllm:lora_requests_info as the scraper reads it.
func scrapedAdapters(s sim.Stats, prof sim.Profile) workers.Adapters {
	if prof.MaxLoRAs <= 0 {
		return workers.Adapters{}
	}
	return workers.Adapters{Running: s.RunningLoRAs, Waiting: s.WaitingLoRAs, MaxLoRAs: prof.MaxLoRAs}
}

// LoRAPolicies are the policies kvbench runs on LoRA workloads by default: kvroute's
// two, the adapter-affinity baseline and the prefix-affinity one it is built on.
var LoRAPolicies = []string{"kvroute", "kvroute_static", "llmd_lora_affinity", "llmd_prefix_affinity"}

// loraRows are the scoreboard's LoRA rows (keys start with "lora"): 64 adapters with
// a Zipf 1.1 popularity, 1,000-token system prompt per adapter, 300-token user
// messages, 8 × h100-8b with --max-loras 8 and a 200 ms adapter load; goal: p90 TTFT
// ≥ 1.3× better than the best peer and fewer adapter loads per 1,000 requests.
func loraRows(seeds func(int) int, slo time.Duration) []Row {
	var rows []Row
	for _, c := range []struct {
		rate   float64
		output int
	}{{10, 128}, {16, 256}} {
		o := LoRAOptions{Adapters: 64, Skew: 1.1, SystemTokens: 1000, UserTokens: 300, OutputTokens: c.output, Requests: 1500}
		rows = append(rows, Row{Key: fmt.Sprintf("lora-%g", c.rate),
			Name: fmt.Sprintf("LoRA: 64 adapters (Zipf 1.1), max_loras 8, %d output, %g req/s", c.output, c.rate),
			Goal: GoalLead, Workload: loraWorkload(o), Arrivals: fmt.Sprintf("poisson:%g", c.rate), Workers: 8, Profile: "h100-8b",
			Seeds: seeds(5), SLO: slo, MaxLoRAs: 8, LoRALoad: 200 * time.Millisecond, Policies: LoRAPolicies, FewerLoads: true})
	}
	return rows
}

func loraWorkload(o LoRAOptions) func(uint64) (*Workload, error) {
	return func(seed uint64) (*Workload, error) {
		o := o
		o.Seed = seed
		return LoRA(o), nil
	}
}

// judgeLoads adds the LoRA goal's second half to v: kvroute's mean adapter loads per
// 1,000 requests below every peer's.
func (v *Verdict) judgeLoads(r *RowResult) {
	if v.KV == nil {
		return
	}
	for i := range r.Agg {
		if s := &r.Agg[i]; isPeer(s.Policy) && !(v.KV.AdapterLoads.Mean < s.AdapterLoads.Mean) {
			v.Met = false
			v.Misses = append(v.Misses, fmt.Sprintf("adapter loads/1k %.0f not below %s's %.0f", v.KV.AdapterLoads.Mean, s.Policy, s.AdapterLoads.Mean))
		}
	}
}

// loadsNote is the adapter loads per 1,000 requests of kvroute and of the peer with
// the fewest, for the scoreboard's goal column.
func loadsNote(r *RowResult, v *Verdict) string {
	if v.KV == nil {
		return ""
	}
	best := (*SeedSummary)(nil)
	for i := range r.Agg {
		if s := &r.Agg[i]; isPeer(s.Policy) && (best == nil || s.AdapterLoads.Mean < best.AdapterLoads.Mean) {
			best = s
		}
	}
	if best == nil {
		return ""
	}
	return fmt.Sprintf(" (adapter loads/1k: %.0f vs %s %.0f)", v.KV.AdapterLoads.Mean, best.Policy, best.AdapterLoads.Mean)
}
