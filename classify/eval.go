package classify

import (
	"math"
	"sort"
	"time"
)

// ClassReport is one label's precision, recall and F1 over an evaluation set.
type ClassReport struct {
	Precision float64 `json:"precision"`
	Recall    float64 `json:"recall"`
	F1        float64 `json:"f1"`
	Support   int     `json:"support"`
}

// Report is the result of Evaluate. MacroF1 is the unweighted mean of the per-label F1
// over labels present in the gold set or predicted; P99us is the 99th percentile of one
// Predict call's wall time in microseconds (on the machine that ran it).
type Report struct {
	Rows     int                    `json:"rows"`
	Accuracy float64                `json:"accuracy"`
	MacroF1  float64                `json:"macro_f1"`
	PerClass map[string]ClassReport `json:"per_class"`
	P50us    float64                `json:"p50_us"`
	P99us    float64                `json:"p99_us"`
}

// Evaluate classifies every row with m and scores the predictions against the labels.
func Evaluate(m *Linear, rows []Row) Report {
	gold := make([]string, len(rows))
	pred := make([]string, len(rows))
	lat := make([]float64, len(rows))
	for i, r := range rows {
		t0 := time.Now()
		p := m.Predict(r.Text)
		lat[i] = float64(time.Since(t0).Nanoseconds()) / 1e3
		gold[i], pred[i] = r.Label, p.Label
	}
	rep := Score(gold, pred)
	sort.Float64s(lat)
	rep.P50us = round3(quantile(lat, 0.50))
	rep.P99us = round3(quantile(lat, 0.99))
	return rep
}

// Score compares predicted labels with gold labels (same length).
func Score(gold, pred []string) Report {
	tp, fp, fn := map[string]int{}, map[string]int{}, map[string]int{}
	labels := map[string]bool{}
	correct := 0
	for i := range gold {
		labels[gold[i]], labels[pred[i]] = true, true
		if gold[i] == pred[i] {
			correct++
			tp[gold[i]]++
		} else {
			fp[pred[i]]++
			fn[gold[i]]++
		}
	}
	rep := Report{Rows: len(gold), PerClass: map[string]ClassReport{}}
	if len(gold) == 0 {
		return rep
	}
	rep.Accuracy = round3(float64(correct) / float64(len(gold)))
	var sumF1 float64
	for l := range labels {
		c := ClassReport{Support: tp[l] + fn[l]}
		if tp[l]+fp[l] > 0 {
			c.Precision = float64(tp[l]) / float64(tp[l]+fp[l])
		}
		if tp[l]+fn[l] > 0 {
			c.Recall = float64(tp[l]) / float64(tp[l]+fn[l])
		}
		if c.Precision+c.Recall > 0 {
			c.F1 = 2 * c.Precision * c.Recall / (c.Precision + c.Recall)
		}
		sumF1 += c.F1
		c.Precision, c.Recall, c.F1 = round3(c.Precision), round3(c.Recall), round3(c.F1)
		rep.PerClass[l] = c
	}
	rep.MacroF1 = round3(sumF1 / float64(len(labels)))
	return rep
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	if i < 0 {
		i = 0
	}
	return sorted[i]
}

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }
