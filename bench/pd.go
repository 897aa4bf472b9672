package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workers"
)

// PDOptions describes a prefill/decode workload: prompts of PromptMin..PromptMax tokens
// (uniform) whose first DocShare of tokens is one of Docs shared documents (Zipf 1.1
// popularity: long-context RAG and document chat reuse documents) and the rest unique,
// with OutputMin..OutputMax output tokens (uniform).
type PDOptions struct {
	Requests             int
	PromptMin, PromptMax int
	OutputMin, OutputMax int
	Docs                 int
	DocShare             float64 // 0..1
	Seed                 uint64
}

// PD builds the workload.
func PD(o PDOptions) *Workload {
	r := rand.New(rand.NewPCG(o.Seed, 0x9d))
	docLen := int(float64(o.PromptMax) * o.DocShare)
	docs := make([][]uint32, max(o.Docs, 1))
	for i := range docs {
		docs[i] = randTokens(r, docLen)
	}
	var z *rand.Zipf
	if o.Docs > 1 {
		z = rand.NewZipf(r, 1.1, 1, uint64(o.Docs-1))
	}
	w := &Workload{Name: "pd"}
	for i := 0; i < o.Requests; i++ {
		n := o.PromptMin + r.IntN(max(o.PromptMax-o.PromptMin, 0)+1)
		k := 0
		if z != nil {
			k = int(z.Uint64())
		}
		shared := min(int(float64(n)*o.DocShare), len(docs[k]))
		prompt := append(append([]uint32(nil), docs[k][:shared]...), randTokens(r, n-shared)...)
		out := o.OutputMin + r.IntN(max(o.OutputMax-o.OutputMin, 0)+1)
		w.Items = append(w.Items, Item{Conv: -1, Prompt: prompt, MaxTokens: out, Group: fmt.Sprintf("doc-%02d", k)})
	}
	return w
}

// pdLeg tags a remote prefill's engine request (Request.Tag): its output goes to
// output, not to the request's own state.
type pdLeg struct{ output func(sim.Output) }

// submit sends req as t decides: to t.Worker alone, or — with a remote prefill — first
// to t.PrefillWorker as vLLM's NixlConnector prefill (RemoteDecode, max_tokens 1); when
// that finishes, t.PrefillDone(nil) and req goes to t.Worker reading the held blocks
// (RemoteBlocks: the decode engine charges the transfer, sim/pd.go); *release is set to
// free them on the prefill engine once the decode has its first token. A prefill the
// engine refuses falls back to local prefill (PrefillDone with the error).
func submit(engines map[string]*sim.VirtualEngine, t *router.Ticket, req *sim.Request, release *func()) error {
	dec := engines[t.Worker]
	if !t.RemotePrefill() {
		return dec.Submit(req)
	}
	pe := engines[t.PrefillWorker]
	pre := &sim.Request{ID: req.ID + "-prefill", Prompt: req.Prompt, MaxTokens: 1, LoRA: req.LoRA, CacheSalt: req.CacheSalt, RemoteDecode: true}
	pre.Tag = &pdLeg{output: func(out sim.Output) {
		if !out.Finished {
			return
		}
		t.PrefillDone(nil)
		req.RemoteBlocks = len(out.HeldBlocks)
		*release = func() { pe.Release(pre) }
		if err := dec.Submit(req); err != nil {
			pe.Release(pre)
			t.Abort()
		}
	}}
	if err := pe.Submit(pre); err != nil {
		t.PrefillDone(err)
		return dec.Submit(req)
	}
	return nil
}

// PolicyAggregated is the scoreboard's name for kvroute on the same workers without
// roles (every worker aggregated): the reference a P/D fleet is compared with.
const PolicyAggregated = "kvroute_aggregated"

// PDGoals of the P/D rows: pd-lead — kvroute's p90 TTFT or p90 ITL ≥ LeadFactor×
// better than llmd_pd's, the other within LevelTolerance; pd-level — both at least
// PDLevelFactor of the better of llmd_pd and kvroute_aggregated (p90 ≤ best ÷ it).
const (
	GoalPDLead    = "pd-lead"
	GoalPDLevel   = "pd-level"
	PDLevelFactor = 0.97
)

// pdRoles is n prefill then m decode workers.
func pdRoles(prefill, decode int, decodeRole workers.Role) []workers.Role {
	out := make([]workers.Role, 0, prefill+decode)
	for i := 0; i < prefill; i++ {
		out = append(out, workers.RolePrefill)
	}
	for i := 0; i < decode; i++ {
		out = append(out, decodeRole)
	}
	return out
}

// PDProfile sets the P/D link of a row's engines: 25 GB/s (a 200 Gb/s RDMA link) and
// 2 ms per read, kvroute's defaults (scoring.kv_transfer_bytes_per_second,
// kv_transfer_latency): the operator configured the link it has.
func PDProfile(p *sim.Profile) {
	p.KVTransferBytesPerSecond, p.KVTransferLatency = 25e9, 2*time.Millisecond
}

// pdRows are the scoreboard's P/D rows (keys start with "pd"), 8 × h100-8b:
//   - pd-long: 4 prefill + 4 decode workers, prompts 8k–64k tokens (half of each a
//     shared document, 16 documents), outputs 64–512, 1.6 req/s; goal pd-lead vs
//     llmd_pd;
//   - pd-short: 8 both-role workers, prompts 256–2,048 tokens, outputs 64–512, 12 req/s,
//     where disaggregating loses; goal pd-level vs llmd_pd on the same roles and
//     kvroute on the 8 workers aggregated.
func pdRows(seeds func(int) int, slo time.Duration) []Row {
	long := PDOptions{Requests: 400, PromptMin: 8192, PromptMax: 65536, OutputMin: 64, OutputMax: 512, Docs: 16, DocShare: 0.5}
	short := PDOptions{Requests: 1200, PromptMin: 256, PromptMax: 2048, OutputMin: 64, OutputMax: 512, Docs: 16, DocShare: 0.5}
	return []Row{
		{Key: "pd-long", Name: "P/D: 4 prefill + 4 decode, prompts 8k–64k, outputs 64–512, 1.6 req/s", Goal: GoalPDLead,
			Workload: pdWorkload(long), Arrivals: "poisson:1.6", Workers: 8, Profile: "h100-8b", Seeds: seeds(3), SLO: slo,
			Roles: pdRoles(4, 4, workers.RoleDecode), Policies: []string{"kvroute", "llmd_pd"}},
		{Key: "pd-short", Name: "P/D: 8 both-role workers, prompts 256–2k, outputs 64–512, 12 req/s", Goal: GoalPDLevel,
			Workload: pdWorkload(short), Arrivals: "poisson:12", Workers: 8, Profile: "h100-8b", Seeds: seeds(3), SLO: slo,
			Roles: pdRoles(0, 8, workers.RoleBoth), Policies: []string{"kvroute", "llmd_pd", PolicyAggregated}},
	}
}

func pdWorkload(o PDOptions) func(uint64) (*Workload, error) {
	return func(seed uint64) (*Workload, error) {
		o := o
		o.Seed = seed
		return PD(o), nil
	}
}

// judgePD is Judge for the P/D goals: kvroute's mean p90 TTFT and p90 ITL against
// llmd_pd's (pd-lead) or the better of llmd_pd's and kvroute_aggregated's (pd-level).
func (r *RowResult) judgePD() Verdict {
	var v Verdict
	var ref []*SeedSummary
	for i := range r.Agg {
		s := &r.Agg[i]
		switch {
		case s.Policy == "kvroute":
			v.KV = s
		case s.Policy == "llmd_pd" || (r.Goal == GoalPDLevel && s.Policy == PolicyAggregated):
			ref = append(ref, s)
		}
	}
	v.P50, v.P90, v.P99, v.Goodput, v.VsStatic = math.NaN(), math.NaN(), math.NaN(), math.NaN(), math.NaN()
	if v.KV == nil || len(ref) == 0 {
		v.Misses = append(v.Misses, "no kvroute or reference result")
		return v
	}
	best := func(get func(*SeedSummary) float64) *SeedSummary {
		b := ref[0]
		for _, s := range ref[1:] {
			if get(s) < get(b) {
				b = s
			}
		}
		return b
	}
	ttft := func(s *SeedSummary) float64 { return s.TTFTp90.Mean }
	itl := func(s *SeedSummary) float64 { return s.ITLp90.Mean }
	v.BestP90 = best(ttft)
	v.BestP50, v.BestP99, v.BestGoodput = v.BestP90, v.BestP90, v.BestP90
	v.P50 = v.KV.TTFTp50.Mean / v.BestP90.TTFTp50.Mean
	v.P90 = ttft(v.KV) / ttft(v.BestP90)
	v.P99 = v.KV.TTFTp99.Mean / v.BestP90.TTFTp99.Mean
	v.Goodput = v.KV.Goodput.Mean / v.BestP90.Goodput.Mean
	bi := best(itl)
	ri := itl(v.KV) / itl(bi)
	v.ITL, v.BestITL = ri, bi
	v.Met = true
	switch r.Goal {
	case GoalPDLead:
		lead := v.P90 <= 1/LeadFactor && ri <= LevelTolerance || ri <= 1/LeadFactor && v.P90 <= LevelTolerance
		if !lead {
			v.Met = false
			v.Misses = append(v.Misses, fmt.Sprintf("p90 TTFT ÷ %.2f, p90 ITL ÷ %.2f: neither ≥ %.1f× better with the other within %.0f %%",
				v.P90, ri, LeadFactor, 100*(LevelTolerance-1)))
		}
	default:
		if v.P90 > 1/PDLevelFactor || ri > 1/PDLevelFactor {
			v.Met = false
			v.Misses = append(v.Misses, fmt.Sprintf("p90 TTFT ÷ %.2f, p90 ITL ÷ %.2f: not both ≥ %.2f× the better reference", v.P90, ri, PDLevelFactor))
		}
	}
	return v
}

// pdNote is the p90 ITL comparison for a P/D row's goal column.
func pdNote(v *Verdict) string {
	if v.KV == nil || v.BestITL == nil {
		return ""
	}
	return fmt.Sprintf(" (p90 ITL %.1f ms vs %s %.1f ms: ÷ %.2f)", 1000*v.KV.ITLp90.Mean, v.BestITL.Policy, 1000*v.BestITL.ITLp90.Mean, v.ITL)
}

// PDPolicies are the policies kvbench runs on P/D workloads by default: kvroute and
// the llm-d P/D baseline.
var PDPolicies = []string{"kvroute", "llmd_pd"}
