package bench

import (
	"math"
	"sort"
	"time"
)

// Result is what happened to one request.
type Result struct {
	Index        int           `json:"index"`
	Start        time.Duration `json:"start_ns"` // sent, from the start of the run
	TTFT         time.Duration `json:"ttft_ns"`  // to the first content token; 0 if none
	E2E          time.Duration `json:"e2e_ns"`
	ITL          time.Duration `json:"itl_ns"` // mean inter-token latency
	PromptTokens int           `json:"prompt_tokens"`
	OutputTokens int           `json:"output_tokens"`
	CachedTokens int           `json:"cached_tokens"`
	Worker       string        `json:"worker,omitempty"`
	// PrefillWorker is the worker that prefilled remotely for Worker (virtual P/D runs);
	// "" when Worker prefilled itself.
	PrefillWorker string        `json:"prefill_worker,omitempty"`
	Predicted     time.Duration `json:"predicted_ttft_ns,omitempty"` // router's prediction (virtual runs)
	Err           string        `json:"error,omitempty"`
	// QoS runs (VirtualOptions.QoS): the request's tenant and class, and how long it
	// waited in kvroute's queue (included in TTFT and E2E, which count from arrival).
	Tenant string        `json:"tenant,omitempty"`
	Class  string        `json:"class,omitempty"`
	Queued time.Duration `json:"queued_ns,omitempty"`
	// AdapterLoad: the worker loaded the request's LoRA adapter for it (virtual runs).
	AdapterLoad bool `json:"adapter_load,omitempty"`
	// RefuseWall is the router's wall-clock time to refuse a request no worker was
	// predicted to start within its objective (Err "slo_miss"); 0 otherwise.
	RefuseWall time.Duration `json:"refuse_wall_ns,omitempty"`
}

// Percentile returns the p-th percentile (0..100) of xs by linear interpolation
// between closest ranks (numpy's default); NaN for no data. xs is sorted in place.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	sort.Float64s(xs)
	if p <= 0 {
		return xs[0]
	}
	if p >= 100 {
		return xs[len(xs)-1]
	}
	pos := p / 100 * float64(len(xs)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(xs)-1)
	return xs[lo] + (xs[hi]-xs[lo])*(pos-float64(lo))
}

// Summary is the per-policy report.
type Summary struct {
	Policy            string         `json:"policy"`
	Arrivals          string         `json:"arrivals"`
	Seed              uint64         `json:"seed,omitempty"` // set by multi-seed runs
	Requests          int            `json:"requests"`
	Errors            int            `json:"errors"`
	TTFTp50           float64        `json:"ttft_p50_s"`
	TTFTp90           float64        `json:"ttft_p90_s"`
	TTFTp99           float64        `json:"ttft_p99_s"`
	E2Ep50            float64        `json:"e2e_p50_s"`
	E2Ep99            float64        `json:"e2e_p99_s"`
	ITLp50            float64        `json:"itl_p50_s"`
	ITLp90            float64        `json:"itl_p90_s"`
	Goodput           float64        `json:"goodput_rpm"`                    // requests per minute meeting the TTFT SLO
	SLO               float64        `json:"slo_ttft_s"`                     // the SLO used
	SLOMet            float64        `json:"slo_met_frac"`                   // fraction of requests meeting it
	Throughput        float64        `json:"throughput_rpm"`                 // completed requests per minute
	HitRatio          float64        `json:"cache_hit_ratio"`                // cached / prompt tokens
	HitBound          float64        `json:"cache_hit_bound"`                // infinite single cache over the same workload
	HitPooled         float64        `json:"cache_hit_pooled_lru,omitempty"` // one LRU cache of the cluster's total capacity (virtual runs)
	LoadCV            float64        `json:"load_cv"`                        // coefficient of variation of requests per worker
	PerWorker         map[string]int `json:"requests_per_worker,omitempty"`
	AdapterLoadsPer1k float64        `json:"adapter_loads_per_1k,omitempty"`  // LoRA adapter loads per 1,000 requests (virtual runs)
	PredMAE           float64        `json:"prediction_mae_s,omitempty"`      // mean |predicted − observed| TTFT
	PredMedRel        float64        `json:"prediction_median_rel,omitempty"` // median |pred − obs| / obs
	DurationS         float64        `json:"duration_s"`
	// Refused counts requests refused by SLO admission (Err "slo_miss", kvbench
	// --admission refuse); RefusedP99 is the router's p99 wall-clock time to refuse them.
	// They count in Errors too and never in goodput.
	Refused    int     `json:"refused"`
	RefusedP99 float64 `json:"refused_p99_s"`
	// MissPrecision and MissRecall grade the prediction as a refusal decision, over the
	// requests that were routed (not refused) with a prediction: "predicted TTFT > SLO"
	// against "observed TTFT > SLO". Precision: of those predicted to miss, the share
	// that did; recall: of those that missed, the share predicted to. NaN-free: 0 when
	// undefined (see MissPredicted, Missed).
	MissPrecision float64 `json:"miss_precision"`
	MissRecall    float64 `json:"miss_recall"`
	MissPredicted int     `json:"miss_predicted"`
	Missed        int     `json:"missed"`
	// Classes, for runs whose requests carry a class (admission runs), is per class:
	// its requests, how many were refused, and the share of all of them (refused ones
	// included) whose TTFT met the SLO.
	Classes map[string]ClassMet `json:"classes,omitempty"`
	// Flash, for --flash-crowd runs: SLO attainment by arrival window around the burst.
	Flash   *FlashReport `json:"flash_crowd,omitempty"`
	Results []Result     `json:"results,omitempty"`
}

// ClassMet is one class's outcome in a Summary.
type ClassMet struct {
	Requests int     `json:"requests"`
	Refused  int     `json:"refused"`
	SLOMet   float64 `json:"slo_met_frac"`
}

// Summarize computes the summary of results. slo is the TTFT objective; bound the
// workload's cache-hit bound; workers the names all workers (for load spread; nil =
// those seen).
func Summarize(policy string, arr string, rs []Result, slo time.Duration, bound float64, workers []string) Summary {
	s := Summary{Policy: policy, Arrivals: arr, Requests: len(rs), SLO: slo.Seconds(), HitBound: bound, PerWorker: map[string]int{}, Results: rs}
	for _, w := range workers {
		s.PerWorker[w] = 0
	}
	var ttft, e2e, itl, absErr, relErr []float64
	var prompt, cached int
	var first, last time.Duration = -1, 0
	met, loads := 0, 0
	var refuse []float64
	tp := 0
	classMet := map[string]int{}
	for _, r := range rs {
		if r.Class != "" {
			if s.Classes == nil {
				s.Classes = map[string]ClassMet{}
			}
			c := s.Classes[r.Class]
			c.Requests++
			if r.Err == "slo_miss" {
				c.Refused++
			}
			if r.Err == "" && r.TTFT > 0 && r.TTFT <= slo {
				classMet[r.Class]++
			}
			s.Classes[r.Class] = c
		}
		if r.AdapterLoad {
			loads++
		}
		if first < 0 || r.Start < first {
			first = r.Start
		}
		if end := r.Start + r.E2E; end > last {
			last = end
		}
		if r.Err != "" {
			s.Errors++
			if r.Err == "slo_miss" {
				s.Refused++
				refuse = append(refuse, r.RefuseWall.Seconds())
			}
			continue
		}
		if r.Worker != "" {
			s.PerWorker[r.Worker]++
		}
		ttft = append(ttft, r.TTFT.Seconds())
		e2e = append(e2e, r.E2E.Seconds())
		if r.ITL > 0 {
			itl = append(itl, r.ITL.Seconds())
		}
		if r.TTFT <= slo {
			met++
		}
		prompt += r.PromptTokens
		cached += r.CachedTokens
		if r.Predicted > 0 && r.TTFT > 0 && slo > 0 {
			pm, m := r.Predicted > slo, r.TTFT > slo
			if pm {
				s.MissPredicted++
			}
			if m {
				s.Missed++
			}
			if pm && m {
				tp++
			}
		}
		if r.Predicted > 0 && r.TTFT > 0 {
			d := math.Abs((r.Predicted - r.TTFT).Seconds())
			absErr = append(absErr, d)
			relErr = append(relErr, d/r.TTFT.Seconds())
		}
	}
	s.TTFTp50, s.TTFTp90, s.TTFTp99 = Percentile(ttft, 50), Percentile(ttft, 90), Percentile(ttft, 99)
	s.E2Ep50, s.E2Ep99 = Percentile(e2e, 50), Percentile(e2e, 99)
	s.ITLp50, s.ITLp90 = Percentile(itl, 50), Percentile(itl, 90)
	if first >= 0 && last > first {
		s.DurationS = (last - first).Seconds()
		s.Goodput = float64(met) / s.DurationS * 60
		s.Throughput = float64(len(ttft)) / s.DurationS * 60
	}
	if len(rs) > 0 {
		s.SLOMet = float64(met) / float64(len(rs))
	}
	for k, c := range s.Classes {
		c.SLOMet = float64(classMet[k]) / float64(c.Requests)
		s.Classes[k] = c
	}
	if len(refuse) > 0 {
		s.RefusedP99 = Percentile(refuse, 99)
	}
	if s.MissPredicted > 0 {
		s.MissPrecision = float64(tp) / float64(s.MissPredicted)
	}
	if s.Missed > 0 {
		s.MissRecall = float64(tp) / float64(s.Missed)
	}
	if prompt > 0 {
		s.HitRatio = float64(cached) / float64(prompt)
	}
	if loads > 0 {
		s.AdapterLoadsPer1k = 1000 * float64(loads) / float64(len(rs))
	}
	if len(absErr) > 0 {
		var sum float64
		for _, d := range absErr {
			sum += d
		}
		s.PredMAE = sum / float64(len(absErr))
		s.PredMedRel = Percentile(relErr, 50)
	}
	s.LoadCV = CV(s.PerWorker)
	if len(s.PerWorker) == 0 {
		s.PerWorker = nil
	}
	return s
}

// CV is the coefficient of variation (population σ / mean) of per-worker counts.
func CV(m map[string]int) float64 {
	if len(m) < 2 {
		return 0
	}
	var sum float64
	for _, v := range m {
		sum += float64(v)
	}
	mean := sum / float64(len(m))
	if mean == 0 {
		return 0
	}
	var ss float64
	for _, v := range m {
		d := float64(v) - mean
		ss += d * d
	}
	return math.Sqrt(ss/float64(len(m))) / mean
}
