package bench

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workers"
)

// Row goals of the scoreboard: on a "level" row kvroute's mean p90 TTFT may
// be at most 3 % worse than the best peer's; on a "lead" row (overload, heterogeneous
// pool, slowdown, multi-turn) it must be ≥ 1.3× better. On every row kvroute must be
// at least as good as kvroute_static (mean p90 within 3 %).
const (
	GoalLevel = "level"
	GoalLead  = "lead"
	// LevelTolerance is how much worse than the best peer a "level" row may be.
	LevelTolerance = 1.03
	// LeadFactor is how much better than the best peer a "lead" row must be.
	LeadFactor = 1.3
)

// Row is one scoreboard point: a workload at one load on one pool, run with every
// policy over Seeds seeds (seed s = 1..Seeds drives the workload, the arrivals, the
// policies' randomness and the engines' hash seeds).
type Row struct {
	Key      string // short id: output folder and --rows filter
	Name     string // what the row measures, for the table
	Goal     string // GoalLevel or GoalLead
	Workload func(seed uint64) (*Workload, error)
	Arrivals string // ParseArrivals form
	Workers  int
	Profile  string // sim profile name
	Speeds   []float64
	Slow     []Slowdown
	Known    bool // registry knows the true speeds
	Seeds    int
	SLO      time.Duration
	// LoRA rows (lora.go): the engines' --max-loras and adapter load time, the policies
	// the row runs (nil: the run's), and the goal's second half: fewer adapter loads per
	// 1,000 requests than every peer.
	MaxLoRAs   int
	LoRALoad   time.Duration
	Policies   []string
	FewerLoads bool
	// Roles are the workers' prefill/decode roles on P/D rows (pd.go); the
	// kvroute_aggregated policy runs without them.
	Roles []workers.Role
	// Admission, on overload rows (overload.go), is the class kvroute runs behind
	// (peers and kvroute_admit_all run without it).
	Admission *config.Class
}

// ScoreboardOptions selects the scoreboard's rows.
type ScoreboardOptions struct {
	// TracePath is the Mooncake conversation trace; its rows are left out when the file
	// cannot be read.
	TracePath string
	// Seeds overrides every seed-sensitive row's seed count when > 0; TraceSeeds the trace
	// rows' (default 1: the trace fixes arrivals and prompts, only the policies' and
	// engines' randomness would change).
	Seeds, TraceSeeds int
}

// sharedPrefix builds the shared-prefix workload of o for a seed.
func sharedPrefix(o SharedPrefixOptions) func(uint64) (*Workload, error) {
	return func(seed uint64) (*Workload, error) {
		o := o
		o.Seed = seed
		return SharedPrefix(o), nil
	}
}

func multiTurn(o MultiTurnOptions) func(uint64) (*Workload, error) {
	return func(seed uint64) (*Workload, error) {
		o := o
		o.Seed = seed
		return MultiTurn(o), nil
	}
}

// traceLoader parses the trace once per (speed, duration) and shares it between seeds.
func traceLoader(path string, o TraceOptions) func(uint64) (*Workload, error) {
	var once sync.Once
	var w *Workload
	var err error
	return func(uint64) (*Workload, error) {
		once.Do(func() {
			var f io.ReadCloser
			if f, err = OpenTrace(path); err != nil {
				return
			}
			defer f.Close()
			w, err = ParseMooncake(f, o)
		})
		return w, err
	}
}

// ScoreboardRows returns the scoreboard, sized to finish `make bench` on a
// 2-core machine (see BENCHMARKS.md for the time it took):
//   - shared prefix (8 × 6,000-token prefixes, 200-token suffix, 64 output tokens, 400
//     requests), uniform and hot (16 prefixes, Zipf 1.2), Poisson 1–4 req/s, 3 × l40s-27b;
//   - multi-turn chat (60 conversations × 6 turns, 1,000-token shared system prompt,
//     300-token user turns, 64-token replies, 2 s think time), 3 × l40s-27b, from light
//     (0.25 conversations/s) to saturated (1 conversation/s);
//   - the Mooncake conversation trace on 8 × h100-8b: its first 5 minutes as recorded,
//     its first 10 minutes in 5 (2×), its first 15 minutes in 5 (3×, offered prefill
//     above the cluster's capacity);
//   - a heterogeneous pool: 8 × l40s-27b whose real speeds are 1,1,1,1,2,2,3,3 but which
//     are all configured alike, multi-turn (300 conversations as above) at 4 conv/s;
//   - a slowdown: 8 alike l40s-27b workers, 600 conversations at 2 conv/s (5 minutes of
//     arrivals), worker 0 three times slower from minute 2;
//   - the GuideLLM-like closed loop of Kinference's published test: 29 concurrent
//     streams, 8 × 6,000-token prefixes, 256 output tokens, 3 × l40s-27b.
//
// Seeds: 5 on the shared-prefix uniform rows (spread ≤ 0.04 s), 15 on the rows where one
// early decision changes a whole run (hot prefixes, multi-turn, heterogeneous,
// slowdown, GuideLLM-like: ± up to 0.97 s over seeds on hot 4 req/s; on 5 seeds the
// kvroute ÷ kvroute_static mean moved by up to 0.06 between seed sets).
func ScoreboardRows(o ScoreboardOptions) []Row {
	seeds := func(n int) int {
		if o.Seeds > 0 {
			return o.Seeds
		}
		return n
	}
	slo := 8 * time.Second
	var rows []Row
	sp := SharedPrefixOptions{Prefixes: 8, PrefixTokens: 6000, SuffixTokens: 200, OutputTokens: 64, Requests: 400}
	hot := sp
	hot.Prefixes, hot.Skew = 16, 1.2
	for _, r := range []float64{1, 2, 3, 4} {
		rows = append(rows, Row{Key: fmt.Sprintf("shared-uniform-%g", r), Name: fmt.Sprintf("shared prefix, uniform, %g req/s", r),
			Goal: GoalLevel, Workload: sharedPrefix(sp), Arrivals: fmt.Sprintf("poisson:%g", r), Workers: 3, Profile: "l40s-27b", Seeds: seeds(5), SLO: slo})
	}
	for _, r := range []float64{1, 2, 3, 4} {
		rows = append(rows, Row{Key: fmt.Sprintf("shared-hot-%g", r), Name: fmt.Sprintf("shared prefix, hot (Zipf 1.2), %g req/s", r),
			Goal: GoalLevel, Workload: sharedPrefix(hot), Arrivals: fmt.Sprintf("poisson:%g", r), Workers: 3, Profile: "l40s-27b", Seeds: seeds(15), SLO: slo})
	}
	mt := MultiTurnOptions{Conversations: 60, Turns: 6, SystemTokens: 1000, UserTokens: 300, OutputTokens: 64, Think: 2 * time.Second}
	for _, c := range []struct {
		rate  float64
		label string
	}{{0.25, "light"}, {0.5, "loaded"}, {1, "saturated"}} {
		rows = append(rows, Row{Key: fmt.Sprintf("multi-turn-%g", c.rate), Name: fmt.Sprintf("multi-turn chat, %s (%g conv/s)", c.label, c.rate),
			Goal: GoalLead, Workload: multiTurn(mt), Arrivals: fmt.Sprintf("poisson:%g", c.rate), Workers: 3, Profile: "l40s-27b", Seeds: seeds(15), SLO: slo})
	}
	if f, err := os.Open(o.TracePath); err == nil && o.TracePath != "" {
		f.Close()
		ts := o.TraceSeeds
		if ts <= 0 {
			ts = 1
		}
		for _, c := range []struct {
			speed float64
			goal  string
		}{{1, GoalLevel}, {2, GoalLevel}, {3, GoalLead}} {
			name := fmt.Sprintf("Mooncake trace %g× (first %g min in 5)", c.speed, 5*c.speed)
			if c.speed == 3 {
				name += ", overload"
			}
			rows = append(rows, Row{Key: fmt.Sprintf("mooncake-x%g", c.speed), Name: name, Goal: c.goal,
				Workload: traceLoader(o.TracePath, TraceOptions{Speed: c.speed, MaxDuration: 5 * time.Minute}),
				Arrivals: "trace", Workers: 8, Profile: "h100-8b", Seeds: ts, SLO: slo})
		}
	}
	pool := MultiTurnOptions{Conversations: 600, Turns: 6, SystemTokens: 1000, UserTokens: 300, OutputTokens: 64, Think: 2 * time.Second}
	hetPool := pool
	hetPool.Conversations = 300
	rows = append(rows, Row{Key: "heterogeneous", Name: "heterogeneous pool: 8 × l40s-27b, real speeds 1,1,1,1,2,2,3,3 configured alike, multi-turn 4 conv/s",
		Goal: GoalLead, Workload: multiTurn(hetPool), Arrivals: "poisson:4", Workers: 8, Profile: "l40s-27b",
		Speeds: []float64{1, 1, 1, 1, 2, 2, 3, 3}, Seeds: seeds(15), SLO: slo})
	rows = append(rows, Row{Key: "slowdown", Name: "slowdown: 8 × l40s-27b, worker 0 3× slower from minute 2, multi-turn 2 conv/s",
		Goal: GoalLead, Workload: multiTurn(pool), Arrivals: "poisson:2", Workers: 8, Profile: "l40s-27b",
		Slow: []Slowdown{{Worker: 0, At: 2 * time.Minute, Factor: 3}}, Seeds: seeds(15), SLO: slo})
	rows = append(rows, loraRows(seeds, slo)...)
	rows = append(rows, pdRows(seeds, slo)...)
	if _, err := os.Stat(o.TracePath); err == nil && o.TracePath != "" {
		rows = append(rows, overloadRows(o.TracePath, slo)...)
	}
	gl := SharedPrefixOptions{Prefixes: 8, PrefixTokens: 6000, SuffixTokens: 200, OutputTokens: 256, Requests: 300}
	rows = append(rows, Row{Key: "guidellm", Name: "GuideLLM-like closed loop (29 streams, 8 × 6k prefixes, 256 output)",
		Goal: GoalLevel, Workload: sharedPrefix(gl), Arrivals: "streams:29", Workers: 3, Profile: "l40s-27b", Seeds: seeds(15), SLO: slo})
	return rows
}

// FilterRows keeps the rows whose key matches the regular expression (all for "").
func FilterRows(rows []Row, expr string) ([]Row, error) {
	if expr == "" {
		return rows, nil
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, fmt.Errorf("bench: rows filter: %v", err)
	}
	var out []Row
	for _, r := range rows {
		if re.MatchString(r.Key) {
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("bench: no scoreboard row matches %q", expr)
	}
	return out, nil
}

// RowResult is one row's outcome: every policy's per-seed summaries and their
// aggregate, in policy order.
type RowResult struct {
	Row       Row                  `json:"-"`
	Key       string               `json:"key"`
	Name      string               `json:"name"`
	Goal      string               `json:"goal"`
	Summaries map[string][]Summary `json:"-"`
	Agg       []SeedSummary        `json:"policies"`
	WallS     float64              `json:"wall_s"` // summed wall time of the row's runs
}

// ScoreboardRun configures RunScoreboard.
type ScoreboardRun struct {
	Policies []string // nil: PolicyNames
	Parallel int      // concurrent runs; < 1 means 1
	EventLag time.Duration
	// CacheTurnover turns on kvroute's cache-turnover price in every run (VirtualOptions).
	CacheTurnover bool
	// UtilizationBacklog turns on ρ's backlog factor in every run (VirtualOptions).
	UtilizationBacklog bool
	// KVWait turns on kvroute's KV-wait price in every run (VirtualOptions).
	KVWait bool
	// Log, when set, gets one line per finished run.
	Log io.Writer
}

// RunScoreboard runs every (row, seed, policy) in virtual time and aggregates them.
func RunScoreboard(rows []Row, o ScoreboardRun) ([]RowResult, error) {
	policies := o.Policies
	if len(policies) == 0 {
		policies = PolicyNames()
	}
	if o.Parallel < 1 {
		o.Parallel = 1
	}
	type job struct {
		row, seed, pol int
	}
	type out struct {
		job
		s    Summary
		wall time.Duration
		err  error
	}
	var jobs []job
	for _, r := range rows {
		for _, p := range r.Policies {
			if !slices.Contains(policies, p) {
				policies = append(policies, p)
			}
		}
	}
	for ri, r := range rows {
		for s := 1; s <= max(r.Seeds, 1); s++ {
			for pi, p := range policies {
				if r.Policies == nil || slices.Contains(r.Policies, p) {
					jobs = append(jobs, job{ri, s, pi})
				}
			}
		}
	}
	// Workloads are built once per (row, seed) and shared read-only between policies.
	type wkey struct{ row, seed int }
	var wmu sync.Mutex
	wls := map[wkey]*Workload{}
	workload := func(j job) (*Workload, Arrivals, error) {
		r := rows[j.row]
		a, err := ParseArrivals(r.Arrivals, uint64(j.seed))
		if err != nil {
			return nil, a, err
		}
		wmu.Lock()
		defer wmu.Unlock()
		k := wkey{j.row, j.seed}
		if w, ok := wls[k]; ok {
			return w, a, nil
		}
		w, err := r.Workload(uint64(j.seed))
		if err != nil {
			return nil, a, fmt.Errorf("bench: row %s: %w", r.Key, err)
		}
		w = a.Apply(w)
		wls[k] = w
		return w, a, nil
	}
	ch := make(chan job)
	res := make(chan out)
	var wg sync.WaitGroup
	for i := 0; i < o.Parallel; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range ch {
				start := time.Now()
				r := rows[j.row]
				var o2 out
				o2.job = j
				w, a, err := workload(j)
				if err == nil {
					var prof sim.Profile
					if prof, err = sim.LookupProfile(r.Profile); err == nil {
						prof.MaxLoRAs, prof.LoRALoadTime = r.MaxLoRAs, r.LoRALoad
						pol, roles, adm := policies[j.pol], r.Roles, r.Admission
						switch {
						case pol == PolicyAggregated:
							pol, roles = "kvroute", nil
						case pol == PolicyAdmitAll:
							pol, adm = "kvroute", nil
						case pol != "kvroute":
							adm = nil
						}
						if roles != nil {
							PDProfile(&prof)
						}
						var rs []Result
						rs, err = RunVirtual(w, VirtualOptions{Workers: r.Workers, Profile: prof, Policy: pol, Arrivals: a, Roles: roles, Admission: adm,
							Seed: uint64(j.seed), EventLag: o.EventLag, Speeds: r.Speeds, Slowdowns: r.Slow, KnownSpeeds: r.Known, CacheTurnover: o.CacheTurnover, UtilizationBacklog: o.UtilizationBacklog, KVWait: o.KVWait})
						if err == nil {
							o2.s = Summarize(policies[j.pol], a.String(), rs, r.SLO, 0, WorkerNames(r.Workers))
							o2.s.Results, o2.s.Seed = nil, uint64(j.seed)
						}
					}
				}
				o2.err, o2.wall = err, time.Since(start)
				res <- o2
			}
		}()
	}
	go func() {
		for _, j := range jobs {
			ch <- j
		}
		close(ch)
	}()
	go func() { wg.Wait(); close(res) }()
	results := make([]RowResult, len(rows))
	for i, r := range rows {
		results[i] = RowResult{Row: r, Key: r.Key, Name: r.Name, Goal: r.Goal, Summaries: map[string][]Summary{}}
	}
	var firstErr error
	done := 0
	for o2 := range res {
		done++
		if o2.err != nil {
			if firstErr == nil {
				firstErr = o2.err
			}
			continue
		}
		rr := &results[o2.row]
		rr.Summaries[policies[o2.pol]] = append(rr.Summaries[policies[o2.pol]], o2.s)
		rr.WallS += o2.wall.Seconds()
		if o.Log != nil {
			fmt.Fprintf(o.Log, "[%d/%d] %s seed %d %s: p90 %.2f s (%.1f s wall)\n", done, len(jobs), rows[o2.row].Key, o2.seed,
				policies[o2.pol], o2.s.TTFTp90, o2.wall.Seconds())
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	for i := range results {
		for _, p := range policies {
			ss := results[i].Summaries[p]
			if len(ss) == 0 {
				continue // a policy the row does not run
			}
			sort.Slice(ss, func(a, b int) bool { return ss[a].Seed < ss[b].Seed })
			results[i].Agg = append(results[i].Agg, AggregateSeeds(ss))
		}
	}
	return results, nil
}

// Peer policies are every policy but kvroute's own two.
func isPeer(p string) bool { return p != "kvroute" && p != "kvroute_static" && p != PolicyAdmitAll }

// Verdict is one row's comparison of kvroute with its peers.
type Verdict struct {
	KV, Static *SeedSummary
	// Best peer per metric (lowest mean p50/p90/p99 TTFT, highest mean goodput) and
	// kvroute's mean ÷ that peer's mean.
	BestP50, BestP90, BestP99, BestGoodput *SeedSummary
	P50, P90, P99, Goodput                 float64
	VsStatic                               float64 // kvroute mean p90 ÷ kvroute_static mean p90
	// P/D rows (judgePD): the reference with the lowest mean p90 ITL, and kvroute's ÷ it.
	BestITL *SeedSummary
	ITL     float64
	Met     bool
	Misses  []string
}

// Judge compares kvroute with the best peer on each metric and checks the row's goal.
func (r *RowResult) Judge() Verdict {
	if r.Goal == GoalPDLead || r.Goal == GoalPDLevel {
		return r.judgePD()
	}
	if r.Goal == GoalOverload || r.Goal == GoalOverloadLevel {
		return r.judgeOverload()
	}
	var v Verdict
	best := func(cur *SeedSummary, s *SeedSummary, get func(*SeedSummary) float64, lower bool) *SeedSummary {
		x := get(s)
		if math.IsNaN(x) {
			return cur
		}
		if cur == nil || (lower && x < get(cur)) || (!lower && x > get(cur)) {
			return s
		}
		return cur
	}
	p50 := func(s *SeedSummary) float64 { return s.TTFTp50.Mean }
	p90 := func(s *SeedSummary) float64 { return s.TTFTp90.Mean }
	p99 := func(s *SeedSummary) float64 { return s.TTFTp99.Mean }
	gp := func(s *SeedSummary) float64 { return s.Goodput.Mean }
	for i := range r.Agg {
		s := &r.Agg[i]
		switch {
		case s.Policy == "kvroute":
			v.KV = s
		case s.Policy == "kvroute_static":
			v.Static = s
		case isPeer(s.Policy):
			v.BestP50 = best(v.BestP50, s, p50, true)
			v.BestP90 = best(v.BestP90, s, p90, true)
			v.BestP99 = best(v.BestP99, s, p99, true)
			v.BestGoodput = best(v.BestGoodput, s, gp, false)
		}
	}
	div := func(a *SeedSummary, b *SeedSummary, get func(*SeedSummary) float64) float64 {
		if a == nil || b == nil || get(b) <= 0 {
			return math.NaN()
		}
		return get(a) / get(b)
	}
	v.P50, v.P90, v.P99 = div(v.KV, v.BestP50, p50), div(v.KV, v.BestP90, p90), div(v.KV, v.BestP99, p99)
	v.Goodput = div(v.KV, v.BestGoodput, gp)
	v.VsStatic = div(v.KV, v.Static, p90)
	v.Met = true
	switch {
	case math.IsNaN(v.P90):
		v.Met = false
		v.Misses = append(v.Misses, "no kvroute or peer result")
	case r.Goal == GoalLead && v.P90 > 1/LeadFactor:
		v.Met = false
		v.Misses = append(v.Misses, fmt.Sprintf("p90 not ≥ %.1f× better", LeadFactor))
	case r.Goal != GoalLead && v.P90 > LevelTolerance:
		v.Met = false
		v.Misses = append(v.Misses, fmt.Sprintf("p90 > %.0f %% worse", 100*(LevelTolerance-1)))
	}
	if r.Row.FewerLoads {
		v.judgeLoads(r)
	}
	if !math.IsNaN(v.VsStatic) && v.VsStatic > LevelTolerance {
		v.Met = false
		v.Misses = append(v.Misses, "behind kvroute_static")
	}
	return v
}

func fmtRatio(x float64) string {
	if math.IsNaN(x) {
		return "-"
	}
	return fmt.Sprintf("%.2f", x)
}

func policyName(s *SeedSummary) string {
	if s == nil {
		return "-"
	}
	return s.Policy
}

// WriteScoreboard writes the scoreboard as a markdown table with a legend.
func WriteScoreboard(w io.Writer, rs []RowResult, elapsed time.Duration, command string) {
	fmt.Fprintf(w, "Generated by `%s` in %s of wall time (virtual time; results do not depend on the machine).\n", command, elapsed.Round(time.Second))
	fmt.Fprintf(w, "Ratios are kvroute's mean ÷ the best peer's mean over the row's seeds, the best peer taken per column among every\n"+
		"policy but kvroute's own two: below 1 kvroute is faster (TTFT p50/p90/p99), above 1 it has more goodput\n"+
		"(requests/min with TTFT ≤ the SLO). Goal: p90 ratio ≤ %.2f on *level* rows, ≤ %.2f (≥ %.1f× better) on *lead* rows,\n"+
		"and kvroute ÷ kvroute_static p90 ≤ %.2f everywhere. Spread = population standard deviation over seeds.\n\n",
		LevelTolerance, 1/LeadFactor, LeadFactor, LevelTolerance)
	fmt.Fprintln(w, "| row | goal | seeds | kvroute p90 (s) | best peer (p90) | its p90 (s) | p50 ÷ | p90 ÷ | p99 ÷ | goodput ÷ | ÷ kvroute_static p90 | met |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for i := range rs {
		r := &rs[i]
		v := r.Judge()
		kvp90, peerp90, seeds := "-", "-", 0
		if v.KV != nil {
			kvp90, seeds = v.KV.TTFTp90.String(), v.KV.Seeds
		}
		if v.BestP90 != nil {
			peerp90 = v.BestP90.TTFTp90.String()
		}
		met := "yes"
		if !v.Met {
			met = "**no**: " + strings.Join(v.Misses, "; ")
		}
		if r.Row.FewerLoads {
			met += loadsNote(r, &v)
		}
		if r.Row.Roles != nil {
			met += pdNote(&v)
		}
		if r.Row.Admission != nil {
			met += overloadNote(r, &v)
		}
		fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s | %s (%s) | %s | %s (%s) | %s | %s | %s |\n", r.Name, r.Goal, seeds, kvp90,
			policyName(v.BestP90), peerp90, fmtRatio(v.P50), policyName(v.BestP50), fmtRatio(v.P90), fmtRatio(v.P99), policyName(v.BestP99),
			fmtRatio(v.Goodput), fmtRatio(v.VsStatic), met)
	}
}

// Markers delimit the generated scoreboard section in a markdown file.
const (
	ScoreboardBegin = "<!-- scoreboard:begin (generated by kvbench --scoreboard; do not edit by hand) -->"
	ScoreboardEnd   = "<!-- scoreboard:end -->"
)

// ErrNoMarkers is returned by SpliceSection when doc lacks the markers.
var ErrNoMarkers = errors.New("bench: scoreboard markers not found")

// SpliceSection replaces what lies between the begin and end markers of doc with
// section (the markers stay). Errors wrap ErrNoMarkers when either is missing or out of
// order.
func SpliceSection(doc, section []byte, begin, end string) ([]byte, error) {
	b := bytes.Index(doc, []byte(begin))
	if b < 0 {
		return nil, fmt.Errorf("%w: %q", ErrNoMarkers, begin)
	}
	rest := doc[b+len(begin):]
	e := bytes.Index(rest, []byte(end))
	if e < 0 {
		return nil, fmt.Errorf("%w: %q after %q", ErrNoMarkers, end, begin)
	}
	var out bytes.Buffer
	out.Write(doc[:b+len(begin)])
	out.WriteByte('\n')
	out.Write(bytes.TrimSpace(section))
	out.WriteString("\n")
	out.Write(rest[e:])
	return out.Bytes(), nil
}
