package bench

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// twoColdRequests are two requests of equal length with nothing in common, at 0 and 10 s.
func twoColdRequests() *Workload {
	w := &Workload{Name: "t"}
	for i := 0; i < 2; i++ {
		p := make([]uint32, 1000)
		for j := range p {
			p[j] = uint32(1000 + i*5000 + j)
		}
		w.Items = append(w.Items, Item{At: time.Duration(i) * 10 * time.Second, Conv: -1, Prompt: p, MaxTokens: 8})
	}
	return w
}

func runOne(t *testing.T, o VirtualOptions) []Result {
	t.Helper()
	o.Workers, o.Profile, o.Arrivals = 1, smallProfile(), Arrivals{Kind: "trace"}
	if o.Policy == "" {
		o.Policy = "round_robin"
	}
	rs, err := RunVirtual(twoColdRequests(), o)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Err != "" {
			t.Fatal(r.Err)
		}
	}
	return rs
}

func near(a, b time.Duration) bool { return math.Abs(float64(a-b)) <= float64(time.Microsecond) }

func TestWorkerSpeedScalesEveryStep(t *testing.T) {
	base := runOne(t, VirtualOptions{})
	// smallProfile: 1,000 prompt tokens in chunks of 512 → 2 steps of 10 ms + 200 µs/token.
	if want := 20*time.Millisecond + 1000*200*time.Microsecond; !near(base[0].TTFT, want) {
		t.Fatalf("TTFT at speed 1 = %v, want %v", base[0].TTFT, want)
	}
	fast := runOne(t, VirtualOptions{Speeds: []float64{2}})
	for i := range base {
		if !near(fast[i].TTFT, base[i].TTFT/2) || !near(fast[i].E2E, base[i].E2E/2) {
			t.Errorf("request %d at speed 2: TTFT %v E2E %v, want half of %v / %v", i, fast[i].TTFT, fast[i].E2E, base[i].TTFT, base[i].E2E)
		}
	}
	// Worker 0 three times slower from 5 s: the first request (done by then) is
	// unchanged, the second takes three times as long.
	slow := runOne(t, VirtualOptions{Slowdowns: []Slowdown{{Worker: 0, At: 5 * time.Second, Factor: 3}}})
	if !near(slow[0].TTFT, base[0].TTFT) || !near(slow[1].TTFT, 3*base[1].TTFT) {
		t.Errorf("slowdown: TTFTs %v, %v; want %v, %v", slow[0].TTFT, slow[1].TTFT, base[0].TTFT, 3*base[1].TTFT)
	}
	// A slowdown composes with the worker's own speed.
	both := runOne(t, VirtualOptions{Speeds: []float64{2}, Slowdowns: []Slowdown{{Worker: 0, At: 5 * time.Second, Factor: 4}}})
	if !near(both[1].TTFT, 2*base[1].TTFT) {
		t.Errorf("speed 2 then 4× slower: TTFT %v, want %v", both[1].TTFT, 2*base[1].TTFT)
	}
}

func TestKnownSpeedsReachTheRegistry(t *testing.T) {
	// kvroute_static predicts from the registry's profile only: told the worker is twice
	// as fast it predicts about half the TTFT; not told, it predicts the plain profile's.
	unknown := runOne(t, VirtualOptions{Policy: "kvroute_static", Speeds: []float64{2}})
	known := runOne(t, VirtualOptions{Policy: "kvroute_static", Speeds: []float64{2}, KnownSpeeds: true})
	u, k := unknown[0].Predicted, known[0].Predicted
	if u <= 0 || k <= 0 || math.Abs(float64(k)/float64(u)-0.5) > 0.05 {
		t.Errorf("predicted TTFT known %v, unknown %v: want known ≈ unknown / 2", k, u)
	}
	if ratio := float64(u) / float64(unknown[0].TTFT); ratio < 1.6 {
		t.Errorf("unknown speed 2: predicted %v vs observed %v, want ≈ 2× too slow", u, unknown[0].TTFT)
	}
}

func TestVirtualRejectsBadSpeedsAndSlowdowns(t *testing.T) {
	w := twoColdRequests()
	for _, o := range []VirtualOptions{
		{Speeds: []float64{1, 2}}, // more speeds than workers
		{Speeds: []float64{-1}},   // not positive
		{Slowdowns: []Slowdown{{Worker: 1, Factor: 2}}},
		{Slowdowns: []Slowdown{{Worker: 0, Factor: 0}}},
	} {
		o.Workers, o.Profile, o.Policy = 1, smallProfile(), "random"
		if _, err := RunVirtual(w, o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}

func TestParseSpeedsAndSlowdown(t *testing.T) {
	if s, err := ParseSpeeds("1, 1,2,0.5"); err != nil || len(s) != 4 || s[3] != 0.5 {
		t.Errorf("ParseSpeeds = %v, %v", s, err)
	}
	if s, err := ParseSpeeds(""); err != nil || s != nil {
		t.Errorf("empty: %v, %v", s, err)
	}
	for _, bad := range []string{"1,x", "0", "-2", "1,,2", "inf", "NaN"} {
		if _, err := ParseSpeeds(bad); err == nil {
			t.Errorf("ParseSpeeds(%q) accepted", bad)
		}
	}
	if sd, err := ParseSlowdown("3:2m:2.5"); err != nil || sd != (Slowdown{Worker: 3, At: 2 * time.Minute, Factor: 2.5}) {
		t.Errorf("ParseSlowdown = %+v, %v", sd, err)
	}
	for _, bad := range []string{"", "1:2m", "x:2m:3", "1:soon:3", "1:2m:0", "-1:2m:3", "1:-2m:3", "1:2m:3:4"} {
		if _, err := ParseSlowdown(bad); err == nil {
			t.Errorf("ParseSlowdown(%q) accepted", bad)
		}
	}
}

func TestSpreadAndAggregate(t *testing.T) {
	s := SpreadOf([]float64{1, 2, math.NaN(), 3, 6})
	if s.N != 4 || s.Mean != 3 || s.Min != 1 || s.Max != 6 || math.Abs(s.SD-math.Sqrt(3.5)) > 1e-12 {
		t.Errorf("spread %+v", s)
	}
	if e := SpreadOf(nil); e.N != 0 || !math.IsNaN(e.Mean) || e.String() != "-" {
		t.Errorf("empty spread %+v", e)
	}
	if b, err := SpreadOf([]float64{math.NaN()}).MarshalJSON(); err != nil || !strings.Contains(string(b), `"mean":null`) {
		t.Errorf("NaN spread JSON %s %v", b, err)
	}
	ss := []Summary{
		{Policy: "a", Arrivals: "x", Seed: 1, TTFTp90: 1, Goodput: 10, Errors: 1},
		{Policy: "b", Arrivals: "x", Seed: 1, TTFTp90: 5},
		{Policy: "a", Arrivals: "x", Seed: 2, TTFTp90: 3, Goodput: 20},
	}
	agg := AggregateBySeeds(ss)
	if len(agg) != 2 || agg[0].Policy != "a" || agg[0].Seeds != 2 || agg[0].TTFTp90.Mean != 2 || agg[0].Goodput.Mean != 15 || agg[0].Errors != 1 {
		t.Errorf("aggregate %+v", agg)
	}
	if agg[0].PredMAE.N != 0 {
		t.Errorf("absent prediction MAE counted: %+v", agg[0].PredMAE)
	}
	var buf bytes.Buffer
	WriteSeedTable(&buf, agg)
	if !strings.Contains(buf.String(), "2.00 ± 1.00") {
		t.Errorf("seed table lacks mean ± sd:\n%s", buf.String())
	}
}

func seedSummary(pol string, p50, p90, p99, gp float64) SeedSummary {
	one := func(x float64) Spread { return SpreadOf([]float64{x}) }
	return SeedSummary{Policy: pol, Seeds: 1, TTFTp50: one(p50), TTFTp90: one(p90), TTFTp99: one(p99), Goodput: one(gp)}
}

func TestJudgeTakesTheBestPeerPerMetric(t *testing.T) {
	r := RowResult{Name: "r", Goal: GoalLevel, Agg: []SeedSummary{
		seedSummary("kvroute", 1, 2, 4, 100),
		seedSummary("kvroute_static", 0.5, 1, 1, 200), // not a peer
		seedSummary("a", 2, 2.5, 3, 90),
		seedSummary("b", 0.8, 4, 8, 95),
	}}
	v := r.Judge()
	if v.BestP50.Policy != "b" || v.BestP90.Policy != "a" || v.BestP99.Policy != "a" || v.BestGoodput.Policy != "b" {
		t.Fatalf("best peers %s %s %s %s", v.BestP50.Policy, v.BestP90.Policy, v.BestP99.Policy, v.BestGoodput.Policy)
	}
	if v.P50 != 1/0.8 || v.P90 != 2/2.5 || v.P99 != 4.0/3 || v.Goodput != 100.0/95 || v.VsStatic != 2 {
		t.Errorf("ratios %+v", v)
	}
	if v.Met || len(v.Misses) != 1 || !strings.Contains(v.Misses[0], "kvroute_static") {
		t.Errorf("level row ahead of peers but 2× behind kvroute_static: met %v %v", v.Met, v.Misses)
	}
	r.Agg[1] = seedSummary("kvroute_static", 1, 2, 4, 100)
	if v := r.Judge(); !v.Met {
		t.Errorf("level row 0.8× of the best peer: %v", v.Misses)
	}
	r.Goal = GoalLead // needs ≤ 1/1.3 = 0.77; 0.8 misses
	if v := r.Judge(); v.Met || !strings.Contains(v.Misses[0], "1.3") {
		t.Errorf("lead row at 0.8×: met %v %v", v.Met, v.Misses)
	}
	var buf bytes.Buffer
	WriteScoreboard(&buf, []RowResult{r}, time.Minute, "kvbench --scoreboard")
	if !strings.Contains(buf.String(), "| r | lead | 1 | 2.00 | a | 2.50 | 1.25 (b) | 0.80 | 1.33 (a) | 1.05 | 1.00 | **no**") {
		t.Errorf("scoreboard row:\n%s", buf.String())
	}
}

func TestSpliceSection(t *testing.T) {
	doc := []byte("# T\nbefore\n" + ScoreboardBegin + "\nold table\n" + ScoreboardEnd + "\nafter\n")
	out, err := SpliceSection(doc, []byte("\nnew table\n\n"), ScoreboardBegin, ScoreboardEnd)
	if err != nil {
		t.Fatal(err)
	}
	want := "# T\nbefore\n" + ScoreboardBegin + "\nnew table\n" + ScoreboardEnd + "\nafter\n"
	if string(out) != want {
		t.Errorf("spliced:\n%s\nwant:\n%s", out, want)
	}
	for _, bad := range []string{"no markers", ScoreboardEnd + "\n" + ScoreboardBegin, ScoreboardBegin + " only"} {
		if _, err := SpliceSection([]byte(bad), []byte("x"), ScoreboardBegin, ScoreboardEnd); !errors.Is(err, ErrNoMarkers) {
			t.Errorf("%q: err %v", bad, err)
		}
	}
}

func TestScoreboardRowsCoverTheIssue(t *testing.T) {
	rows := ScoreboardRows(ScoreboardOptions{TracePath: "/nonexistent/trace.jsonl"})
	keys := map[string]Row{}
	for _, r := range rows {
		keys[r.Key] = r
	}
	for _, k := range []string{"shared-uniform-1", "shared-uniform-4", "shared-hot-1", "shared-hot-4", "multi-turn-0.25", "multi-turn-1",
		"heterogeneous", "slowdown", "guidellm"} {
		r, ok := keys[k]
		if !ok {
			t.Errorf("row %s missing", k)
			continue
		}
		if r.Seeds < 5 {
			t.Errorf("row %s: %d seeds, want ≥ 5", k, r.Seeds)
		}
	}
	if _, ok := keys["mooncake-x1"]; ok {
		t.Error("trace rows present without the trace")
	}
	if h := keys["heterogeneous"]; len(h.Speeds) != 8 || h.Known {
		t.Errorf("heterogeneous row %+v", h)
	}
	if g := keys["guidellm"]; g.Arrivals != "streams:29" {
		t.Errorf("guidellm arrivals %s", g.Arrivals)
	}
	if _, err := FilterRows(rows, "^nothing$"); err == nil {
		t.Error("empty filter result accepted")
	}
	if f, err := FilterRows(rows, "^shared-hot"); err != nil || len(f) != 4 {
		t.Errorf("filter: %d rows, %v", len(f), err)
	}
}

func TestRunScoreboardAggregatesSeeds(t *testing.T) {
	rows := []Row{{Key: "tiny", Name: "tiny", Goal: GoalLevel, Arrivals: "poisson:4", Workers: 2, Profile: "h100-8b", Seeds: 2, SLO: 8 * time.Second,
		Workload: sharedPrefix(SharedPrefixOptions{Prefixes: 2, PrefixTokens: 600, SuffixTokens: 20, OutputTokens: 4, Requests: 30})}}
	res, err := RunScoreboard(rows, ScoreboardRun{Policies: []string{"kvroute", "round_robin"}, Parallel: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || len(res[0].Agg) != 2 || res[0].Agg[0].Policy != "kvroute" || res[0].Agg[0].Seeds != 2 {
		t.Fatalf("result %+v", res)
	}
	ss := res[0].Summaries["kvroute"]
	if len(ss) != 2 || ss[0].Seed != 1 || ss[1].Seed != 2 || ss[0].Requests != 30 {
		t.Fatalf("per-seed summaries %+v", ss)
	}
	if got, want := res[0].Agg[0].TTFTp90.Mean, (ss[0].TTFTp90+ss[1].TTFTp90)/2; got != want {
		t.Errorf("mean p90 %v, want %v", got, want)
	}
	// The same row alone, sequentially, gives the same numbers (runs are independent).
	again, err := RunScoreboard(rows, ScoreboardRun{Policies: []string{"kvroute", "round_robin"}, Parallel: 1})
	if err != nil || again[0].Agg[0].TTFTp90 != res[0].Agg[0].TTFTp90 {
		t.Errorf("parallel and sequential runs differ: %+v vs %+v (%v)", again[0].Agg[0].TTFTp90, res[0].Agg[0].TTFTp90, err)
	}
	rows[0].Profile = "no-such-profile"
	if _, err := RunScoreboard(rows, ScoreboardRun{Policies: []string{"kvroute"}}); err == nil {
		t.Error("unknown profile accepted")
	}
}
