package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"text/tabwriter"
)

// Report is everything one kvbench run produced.
type Report struct {
	Workload  string            `json:"workload"`
	Target    string            `json:"target"` // "virtual" or "http"
	Params    map[string]string `json:"params"`
	Summaries []Summary         `json:"summaries"`
	// Seeds aggregates Summaries over seeds (multi-seed runs only).
	Seeds []SeedSummary `json:"seeds,omitempty"`
}

func fmtS(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	if v >= 10 {
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// WriteTable writes the side-by-side table, grouped by arrivals, with kvroute's ratio
// to each baseline under each group.
func (r *Report) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	// The pooled-LRU and prediction columns only exist for virtual runs.
	pooledCol, predCol := false, false
	for _, s := range r.Summaries {
		pooledCol = pooledCol || s.HitPooled > 0
		predCol = predCol || s.PredMAE > 0
	}
	head := "arrivals\tpolicy\treqs\terr\tTTFT p50\tp90\tp99\tE2E p50\tp99\tgoodput/min\thit\tbound\t"
	if pooledCol {
		head += "pooled\t"
	}
	head += "load CV\t"
	if predCol {
		head += "pred MAE\t"
	}
	fmt.Fprintln(tw, head)
	groups := r.groups()
	for _, g := range groups {
		for _, s := range g {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%.1f\t%.1f%%\t%.1f%%\t", s.Arrivals, s.Policy, s.Requests, s.Errors,
				fmtS(s.TTFTp50), fmtS(s.TTFTp90), fmtS(s.TTFTp99), fmtS(s.E2Ep50), fmtS(s.E2Ep99), s.Goodput, 100*s.HitRatio, 100*s.HitBound)
			if pooledCol {
				fmt.Fprintf(tw, "%.1f%%\t", 100*s.HitPooled)
			}
			fmt.Fprintf(tw, "%.2f\t", s.LoadCV)
			if predCol {
				mae := "-"
				if s.PredMAE > 0 {
					mae = fmtS(s.PredMAE)
				}
				fmt.Fprintf(tw, "%s\t", mae)
			}
			fmt.Fprintln(tw)
		}
	}
	tw.Flush()
	for _, g := range groups {
		var kv *Summary
		for i := range g {
			if g[i].Policy == "kvroute" {
				kv = &g[i]
			}
		}
		if kv == nil {
			continue
		}
		fmt.Fprintf(w, "kvroute vs baselines at %s (× = how many times better than the baseline):\n", kv.Arrivals)
		for _, s := range g {
			if s.Policy == kv.Policy {
				continue
			}
			fmt.Fprintf(w, "  %-22s TTFT p50 %6s×  p90 %6s×  goodput %5s×\n", s.Policy,
				ratio(s.TTFTp50, kv.TTFTp50), ratio(s.TTFTp90, kv.TTFTp90), ratio(kv.Goodput, s.Goodput))
		}
	}
}

func ratio(a, b float64) string {
	if b <= 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "-"
	}
	return fmt.Sprintf("%.1f", a/b)
}

// groups splits summaries by arrivals, keeping order.
func (r *Report) groups() [][]Summary {
	var out [][]Summary
	idx := map[string]int{}
	for _, s := range r.Summaries {
		i, ok := idx[s.Arrivals]
		if !ok {
			i = len(out)
			idx[s.Arrivals] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], s)
	}
	return out
}

// WriteJSON writes the report (with per-request results when keepResults).
func (r *Report) WriteJSON(path string, keepResults bool) error {
	rep := *r
	if !keepResults {
		rep.Summaries = make([]Summary, len(r.Summaries))
		for i, s := range r.Summaries {
			s.Results = nil
			rep.Summaries[i] = s
		}
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
