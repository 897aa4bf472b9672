package bench

import (
	"strings"
	"testing"
	"time"
)

func overloadSummary(policy string, goodput, throughput, p90 float64) SeedSummary {
	return SeedSummary{Policy: policy, Seeds: 1, Goodput: Spread{Mean: goodput}, Throughput: Spread{Mean: throughput}, TTFTp90: Spread{Mean: p90}}
}

// The overload goal needs all three: 5× the best peer's goodput, 60 % of served on
// time, p90 within the SLO; the level goal needs 0.99 × kvroute admitting all.
func TestJudgeOverload(t *testing.T) {
	row := Row{Goal: GoalOverload, SLO: 8 * time.Second}
	cases := []struct {
		kv   SeedSummary
		miss string
	}{
		{overloadSummary("kvroute", 480, 490, 1.5), ""},
		{overloadSummary("kvroute", 140, 150, 1.5), "goodput not ≥ 5×"},
		{overloadSummary("kvroute", 480, 900, 1.5), "of served"},
		{overloadSummary("kvroute", 480, 490, 9), "p90 TTFT past the SLO"},
	}
	for _, c := range cases {
		r := RowResult{Row: row, Goal: row.Goal, Agg: []SeedSummary{c.kv, overloadSummary("dynamo", 30, 330, 138), overloadSummary("sglang_cache_aware", 28, 330, 126)}}
		v := r.Judge()
		if got := strings.Join(v.Misses, "; "); (c.miss == "") != v.Met || !strings.Contains(got, c.miss) {
			t.Errorf("%+v: met %v misses %q, want miss %q", c.kv, v.Met, got, c.miss)
		}
		if v.BestGoodput == nil || v.BestGoodput.Policy != "dynamo" {
			t.Errorf("best goodput peer %+v, want dynamo", v.BestGoodput)
		}
	}
	level := Row{Goal: GoalOverloadLevel, SLO: 8 * time.Second}
	for kv, met := range map[float64]bool{176.2: true, 170: false} {
		r := RowResult{Row: level, Goal: level.Goal, Agg: []SeedSummary{overloadSummary("kvroute", kv, 177, 1.9), overloadSummary(PolicyAdmitAll, 176.9, 180, 2.3), overloadSummary("dynamo", 177.2, 181, 2.5)}}
		if v := r.Judge(); v.Met != met {
			t.Errorf("level, kvroute goodput %v vs 176.9 admitting all: met %v, want %v (%v)", kv, v.Met, met, v.Misses)
		}
	}
	if isPeer(PolicyAdmitAll) {
		t.Error("kvroute_admit_all counted as a peer")
	}
}
