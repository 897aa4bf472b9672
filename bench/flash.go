package bench

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// FlashCrowd is a burst of arrivals: from Start, for Duration, requests arrive Factor
// times as fast as the workload's own arrivals, then at their own rate again (the
// workload's timeline is compressed Factor-fold over the window: Factor × Duration of
// it arrive within Duration).
type FlashCrowd struct {
	Start, Duration time.Duration
	Factor          float64
}

// ParseFlashCrowd parses "START:DURATION:FACTOR", e.g. "60s:60s:10".
func ParseFlashCrowd(s string) (FlashCrowd, error) {
	p := strings.Split(s, ":")
	var f FlashCrowd
	err := fmt.Errorf("want START:DURATION:FACTOR, e.g. 60s:60s:10")
	if len(p) == 3 {
		var e1, e2, e3 error
		f.Start, e1 = time.ParseDuration(p[0])
		f.Duration, e2 = time.ParseDuration(p[1])
		f.Factor, e3 = strconv.ParseFloat(p[2], 64)
		if e1 == nil && e2 == nil && e3 == nil && f.Start >= 0 && f.Duration > 0 && f.Factor >= 1 {
			err = nil
		}
	}
	if err != nil {
		return FlashCrowd{}, fmt.Errorf("bench: flash crowd %q: %v", s, err)
	}
	return f, nil
}

func (f FlashCrowd) String() string {
	return fmt.Sprintf("%s:%s:%g", f.Start, f.Duration, f.Factor)
}

// End is when the burst ends, in the returned workload's time.
func (f FlashCrowd) End() time.Duration { return f.Start + f.Duration }

// Apply returns a copy of w with the arrival times (At of each conversation's first
// item and of standalone items; later turns follow their think times) remapped: a time
// t before Start is kept, one within the Factor × Duration after it is moved to
// Start + (t − Start)/Factor, a later one is moved Duration × (Factor − 1) earlier.
func (f FlashCrowd) Apply(w *Workload) *Workload {
	out := &Workload{Name: w.Name, Items: append([]Item(nil), w.Items...)}
	span := time.Duration(float64(f.Duration) * f.Factor)
	for i := range out.Items {
		it := &out.Items[i]
		if it.Conv >= 0 && it.Turn > 0 {
			continue
		}
		switch t := it.At; {
		case t < f.Start:
		case t < f.Start+span:
			it.At = f.Start + time.Duration(float64(t-f.Start)/f.Factor)
		default:
			it.At = t - span + f.Duration
		}
	}
	return out
}

// FlashReport is SLO attainment by arrival window around a flash crowd.
type FlashReport struct {
	Window float64 `json:"window_s"`
	// Before is the attainment of requests arriving before the burst (the run's normal
	// level); Windows the attainment per window from the start of the run (NaN-free: a
	// window without arrivals is -1).
	Before  float64   `json:"before"`
	Windows []float64 `json:"windows"`
	// RecoveryS is the time from the burst's end to the start of the first window that
	// attains at least 0.95 × Before, as do all the arrivals from it to the end of the
	// run together; -1 when none does.
	RecoveryS float64 `json:"recovery_s"`
}

// Flash computes f's report over rs (Start: arrival; refused and failed requests count
// as missing) with windows of window.
func Flash(rs []Result, slo time.Duration, f FlashCrowd, window time.Duration) *FlashReport {
	rep := &FlashReport{Window: window.Seconds(), RecoveryS: -1}
	var n, met []int
	var bn, bm int
	for _, r := range rs {
		k := int(r.Start / window)
		for len(n) <= k {
			n, met = append(n, 0), append(met, 0)
		}
		ok := r.Err == "" && r.TTFT > 0 && r.TTFT <= slo
		n[k]++
		if ok {
			met[k]++
		}
		if r.Start < f.Start {
			bn++
			if ok {
				bm++
			}
		}
	}
	if bn > 0 {
		rep.Before = float64(bm) / float64(bn)
	}
	rep.Windows = make([]float64, len(n))
	for k := range n {
		rep.Windows[k] = -1
		if n[k] > 0 {
			rep.Windows[k] = float64(met[k]) / float64(n[k])
		}
	}
	first := int((f.End() + window - 1) / window) // the first window wholly after the burst
	level := 0.95 * rep.Before
	for k := first; k < len(n); k++ {
		tn, tm := 0, 0
		for j := k; j < len(n); j++ {
			tn, tm = tn+n[j], tm+met[j]
		}
		if n[k] > 0 && rep.Windows[k] >= level && float64(tm) >= level*float64(tn) {
			rep.RecoveryS = max(0, (time.Duration(k)*window - f.End()).Seconds())
			break
		}
	}
	return rep
}
