package bench

import (
	"fmt"
	"math"
	"time"

	"github.com/kvroute/kvroute/config"
)

// PolicyAdmitAll is the scoreboard's name for kvroute on an overload row run without
// the row's admission class: every request admitted (the reference for needless
// refusals).
const PolicyAdmitAll = "kvroute_admit_all"

// Goals of the overload rows, kvroute running behind the row's refusing class:
//   - overload: goodput ≥ OverloadGoodputFactor × the best peer's (peers admit
//     everything), goodput ≥ OverloadServedShare of kvroute's own served throughput,
//     and the p90 TTFT of the requests it serves within the SLO;
//   - overload-level (no overload): goodput ≥ OverloadLevelFactor × kvroute's without
//     the class (kvroute_admit_all): no needless refusals.
const (
	GoalOverload          = "overload"
	GoalOverloadLevel     = "overload-level"
	OverloadGoodputFactor = 5.0
	OverloadServedShare   = 0.6
	OverloadLevelFactor   = 0.99
)

// overloadRows are the scoreboard's overload rows (keys start with "overload"): the
// Mooncake trace on 8 × h100-8b at 3× (its first 15 minutes in 5) and as recorded (1×),
// kvroute behind a class with on_slo_miss: refuse and objective slo. The trace fixes
// arrivals and prompts: one seed.
func overloadRows(trace string, slo time.Duration) []Row {
	cls := &config.Class{Name: "slo", TTFTObjective: slo, OnSLOMiss: config.SLOMissRefuse}
	row := func(key, name, goal string, speed float64, pols []string) Row {
		return Row{Key: key, Name: name, Goal: goal, Admission: cls, Policies: pols,
			Workload: traceLoader(trace, TraceOptions{Speed: speed, MaxDuration: 5 * time.Minute}),
			Arrivals: "trace", Workers: 8, Profile: "h100-8b", Seeds: 1, SLO: slo}
	}
	return []Row{
		row("overload-x3", "overload: Mooncake 3×, kvroute refusing at 8 s (on_slo_miss: refuse) vs peers admitting all", GoalOverload, 3,
			[]string{"kvroute", "dynamo", "sglang_cache_aware", "llmd_prefix_affinity"}),
		row("overload-x1", "overload: Mooncake 1×, kvroute refusing at 8 s vs kvroute admitting all (needless refusals)", GoalOverloadLevel, 1,
			[]string{"kvroute", PolicyAdmitAll, "dynamo"}),
	}
}

// judgeOverload is Judge for the overload goals.
func (r *RowResult) judgeOverload() Verdict {
	var v Verdict
	var all *SeedSummary
	gp := func(s *SeedSummary) float64 { return s.Goodput.Mean }
	for i := range r.Agg {
		s := &r.Agg[i]
		switch {
		case s.Policy == "kvroute":
			v.KV = s
		case s.Policy == PolicyAdmitAll:
			all = s
		default:
			if v.BestGoodput == nil || gp(s) > gp(v.BestGoodput) {
				v.BestGoodput = s
			}
			if v.BestP90 == nil || s.TTFTp90.Mean < v.BestP90.TTFTp90.Mean {
				v.BestP90 = s
			}
		}
	}
	v.P50, v.P90, v.P99, v.Goodput, v.VsStatic = math.NaN(), math.NaN(), math.NaN(), math.NaN(), math.NaN()
	if v.KV == nil {
		v.Misses = append(v.Misses, "no kvroute result")
		return v
	}
	if v.BestGoodput != nil && gp(v.BestGoodput) > 0 {
		v.Goodput = gp(v.KV) / gp(v.BestGoodput)
	}
	if v.BestP90 != nil && v.BestP90.TTFTp90.Mean > 0 {
		v.P90 = v.KV.TTFTp90.Mean / v.BestP90.TTFTp90.Mean
	}
	v.Met = true
	miss := func(f string, a ...any) { v.Met, v.Misses = false, append(v.Misses, fmt.Sprintf(f, a...)) }
	switch r.Goal {
	case GoalOverload:
		if !(v.Goodput >= OverloadGoodputFactor) {
			miss("goodput not ≥ %.0f× the best peer's", OverloadGoodputFactor)
		}
		if t := v.KV.Throughput.Mean; t <= 0 || gp(v.KV)/t < OverloadServedShare {
			miss("goodput < %.0f %% of served", 100*OverloadServedShare)
		}
		if v.KV.TTFTp90.Mean > r.Row.SLO.Seconds() {
			miss("p90 TTFT past the SLO")
		}
	case GoalOverloadLevel:
		if all == nil || gp(all) <= 0 {
			miss("no %s result", PolicyAdmitAll)
		} else if gp(v.KV)/gp(all) < OverloadLevelFactor {
			miss("goodput < %.2f × %s's", OverloadLevelFactor, PolicyAdmitAll)
		}
	}
	return v
}

// overloadNote is the overload rows' addition to the scoreboard's "met" column.
func overloadNote(r *RowResult, v *Verdict) string {
	if v.KV == nil {
		return ""
	}
	note := fmt.Sprintf(" (goodput %.0f/min", v.KV.Goodput.Mean)
	if t := v.KV.Throughput.Mean; t > 0 {
		note += fmt.Sprintf(", %.2f of served", v.KV.Goodput.Mean/t)
	}
	for i := range r.Agg {
		if s := &r.Agg[i]; s.Policy == PolicyAdmitAll && s.Goodput.Mean > 0 {
			note += fmt.Sprintf(", ÷ %s %.3f", PolicyAdmitAll, v.KV.Goodput.Mean/s.Goodput.Mean)
		}
	}
	return note + ")"
}
