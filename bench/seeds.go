package bench

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"text/tabwriter"
)

// Spread is one statistic over several seeds: mean, population standard deviation,
// extremes and the number of seeds with a value (NaN values are left out).
type Spread struct {
	Mean float64 `json:"mean"`
	SD   float64 `json:"sd"`
	Min  float64 `json:"min"`
	Max  float64 `json:"max"`
	N    int     `json:"n"`
}

// SpreadOf returns the spread of xs, ignoring NaNs; Mean is NaN when none is left.
func SpreadOf(xs []float64) Spread {
	s := Spread{Mean: math.NaN(), SD: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	var sum float64
	for _, x := range xs {
		if math.IsNaN(x) {
			continue
		}
		if s.N == 0 || x < s.Min {
			s.Min = x
		}
		if s.N == 0 || x > s.Max {
			s.Max = x
		}
		sum += x
		s.N++
	}
	if s.N == 0 {
		return s
	}
	s.Mean = sum / float64(s.N)
	var ss float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			ss += (x - s.Mean) * (x - s.Mean)
		}
	}
	s.SD = math.Sqrt(ss / float64(s.N))
	return s
}

// String is "mean ± sd" (just the mean for one seed).
func (s Spread) String() string {
	if s.N == 0 {
		return "-"
	}
	if s.N == 1 {
		return fmtS(s.Mean)
	}
	return fmtS(s.Mean) + " ± " + fmtS(s.SD)
}

// SeedSummary is one policy at one load over several seeds (one Summary per seed).
type SeedSummary struct {
	Policy   string `json:"policy"`
	Arrivals string `json:"arrivals"`
	Seeds    int    `json:"seeds"`
	Errors   int    `json:"errors"` // over all seeds
	TTFTp50  Spread `json:"ttft_p50_s"`
	TTFTp90  Spread `json:"ttft_p90_s"`
	TTFTp99  Spread `json:"ttft_p99_s"`
	E2Ep50   Spread `json:"e2e_p50_s"`
	E2Ep99   Spread `json:"e2e_p99_s"`
	Goodput  Spread `json:"goodput_rpm"`
	// Throughput: completed requests per minute (goodput's denominator on overload rows).
	Throughput Spread `json:"throughput_rpm"`
	HitRatio   Spread `json:"cache_hit_ratio"`
	PredMAE    Spread `json:"prediction_mae_s"`
	ITLp90     Spread `json:"itl_p90_s"` // p90 of the requests' mean inter-token latency
	// AdapterLoads is LoRA adapter loads per 1,000 requests (LoRA workloads).
	AdapterLoads Spread `json:"adapter_loads_per_1k"`
}

// AggregateSeeds summarizes one policy's per-seed summaries (all of the same policy
// and load; the first one names them).
func AggregateSeeds(ss []Summary) SeedSummary {
	if len(ss) == 0 {
		return SeedSummary{}
	}
	out := SeedSummary{Policy: ss[0].Policy, Arrivals: ss[0].Arrivals, Seeds: len(ss)}
	col := func(f func(Summary) float64) Spread {
		xs := make([]float64, len(ss))
		for i, s := range ss {
			xs[i] = f(s)
		}
		return SpreadOf(xs)
	}
	for _, s := range ss {
		out.Errors += s.Errors
	}
	out.TTFTp50 = col(func(s Summary) float64 { return s.TTFTp50 })
	out.TTFTp90 = col(func(s Summary) float64 { return s.TTFTp90 })
	out.TTFTp99 = col(func(s Summary) float64 { return s.TTFTp99 })
	out.E2Ep50 = col(func(s Summary) float64 { return s.E2Ep50 })
	out.E2Ep99 = col(func(s Summary) float64 { return s.E2Ep99 })
	out.Goodput = col(func(s Summary) float64 { return s.Goodput })
	out.Throughput = col(func(s Summary) float64 { return s.Throughput })
	out.ITLp90 = col(func(s Summary) float64 { return s.ITLp90 })
	out.HitRatio = col(func(s Summary) float64 { return s.HitRatio })
	out.AdapterLoads = col(func(s Summary) float64 { return s.AdapterLoadsPer1k })
	out.PredMAE = col(func(s Summary) float64 {
		if s.PredMAE == 0 {
			return math.NaN()
		}
		return s.PredMAE
	})
	return out
}

// WriteSeedTable writes mean ± sd over seeds per policy and load.
func WriteSeedTable(w io.Writer, ss []SeedSummary) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "arrivals\tpolicy\tseeds\terr\tTTFT p50\tp90\tp99\tE2E p50\tgoodput/min\thit\t")
	for _, s := range ss {
		hit := "-"
		if s.HitRatio.N > 0 {
			hit = fmt.Sprintf("%.1f%% ± %.1f", 100*s.HitRatio.Mean, 100*s.HitRatio.SD)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", s.Arrivals, s.Policy, s.Seeds, s.Errors,
			s.TTFTp50, s.TTFTp90, s.TTFTp99, s.E2Ep50, s.Goodput, hit)
	}
	tw.Flush()
}

// AggregateBySeeds groups summaries by (arrivals, policy), in first-seen order, and
// aggregates each group over its seeds.
func AggregateBySeeds(ss []Summary) []SeedSummary {
	type key struct{ arr, pol string }
	var order []key
	groups := map[key][]Summary{}
	for _, s := range ss {
		k := key{s.Arrivals, s.Policy}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], s)
	}
	out := make([]SeedSummary, 0, len(order))
	for _, k := range order {
		out = append(out, AggregateSeeds(groups[k]))
	}
	return out
}

// MarshalJSON writes NaN statistics (no data) as null.
func (s Spread) MarshalJSON() ([]byte, error) {
	num := func(x float64) string {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return "null"
		}
		return strconv.FormatFloat(x, 'g', -1, 64)
	}
	return []byte(fmt.Sprintf(`{"mean":%s,"sd":%s,"min":%s,"max":%s,"n":%d}`, num(s.Mean), num(s.SD), num(s.Min), num(s.Max), s.N)), nil
}
