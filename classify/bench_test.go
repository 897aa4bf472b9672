package classify

import (
	"strings"
	"sync"
	"testing"
)

var (
	benchOnce  sync.Once
	benchModel *Linear
)

// benchLinear is a default-shaped model (2^20 features, 4 labels) trained on the fixture:
// the cost of Predict depends on the feature count and label count, not on the weights.
func benchLinear(b *testing.B) *Linear {
	benchOnce.Do(func() {
		rows, err := ReadRows(fixture)
		if err != nil {
			b.Fatal(err)
		}
		o := DefaultTrainOptions()
		o.Epochs = 1
		benchModel, err = Train(rows, o)
		if err != nil {
			b.Fatal(err)
		}
		// 14 labels, as the MMLU-Pro example: widen the model with copies of its columns.
		k := len(benchModel.Labels)
		w := make([]float32, (1<<o.Features.Bits)*14)
		for f := 0; f < 1<<o.Features.Bits; f++ {
			for c := 0; c < 14; c++ {
				w[f*14+c] = benchModel.W[f*k+c%k]
			}
		}
		labels := make([]string, 14)
		for c := range labels {
			labels[c] = benchModel.Labels[c%k] + strings.Repeat("'", c/k)
		}
		benchModel = &Linear{Features: o.Features, Labels: labels, W: w, B: make([]float32, 14)}
	})
	return benchModel
}

func prose(n int) string {
	rows, _ := ReadRows(fixture)
	var sb strings.Builder
	for sb.Len() < n {
		for _, r := range rows {
			sb.WriteString(r.Text)
			sb.WriteByte('\n')
		}
	}
	return sb.String()[:n]
}

// BenchmarkLinearPredict2KB is the "2 KB prompt" row (target ≤ 50 µs).
func BenchmarkLinearPredict2KB(b *testing.B) {
	m := benchLinear(b)
	text := prose(2 << 10)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		m.Predict(text)
	}
}

// BenchmarkLinearPredict220KB is the "220 KB conversation" row (target ≤ 300 µs): the
// default 4 KB window bounds what is read.
func BenchmarkLinearPredict220KB(b *testing.B) {
	m := benchLinear(b)
	text := prose(220 << 10)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		m.Predict(text)
	}
}
