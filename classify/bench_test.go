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

// benchLinear is a model of the MMLU-Pro example's shape (2^20 features, 14 labels,
// about 300,000 rows) built from one trained on the fixture: the cost of Predict depends
// on the row count, label count and which of a text's features have rows, not on the
// weights' values.
func benchLinear(b *testing.B) *Linear {
	benchOnce.Do(func() {
		rows, err := ReadRows(fixture)
		if err != nil {
			b.Fatal(err)
		}
		o := DefaultTrainOptions()
		o.Epochs = 1
		small, err := Train(rows, o)
		if err != nil {
			b.Fatal(err)
		}
		k := len(small.Labels)
		have := make(map[uint32]int, len(small.Buckets))
		for i, f := range small.Buckets {
			have[f] = i
		}
		m := &Linear{Features: o.Features, Labels: make([]string, 14), B: make([]float32, 14),
			IDFDefault: small.IDFDefault}
		for c := range m.Labels {
			m.Labels[c] = small.Labels[c%k] + strings.Repeat("'", c/k)
		}
		for f := uint32(0); f < 1<<o.Features.Bits; f++ {
			i, ok := have[f]
			if !ok && mix(f)%7 >= 2 {
				continue // 2 in 7 of the other features: about 300,000 rows in all
			}
			m.Buckets = append(m.Buckets, f)
			m.IDF = append(m.IDF, small.IDFDefault)
			for c := 0; c < 14; c++ {
				w := float32(0.01)
				if ok {
					w = small.W[i*k+c%k]
				}
				m.W = append(m.W, w)
			}
		}
		m.index()
		benchModel = m
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
