package classify

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
)

// exampleModelPath is the committed example model (make classify-example).
const exampleModelPath = "../examples/classify/mmlu-pro.kvr"

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

// variedPrompts returns n texts of size bytes, each different: the fixture's questions
// in a shuffled order with about one word in four replaced by a pseudo-word drawn
// (Zipf, s = 1.1) from a vocabulary of 200,000, so the prompts together touch far more
// of the model than one prompt repeated does (and mostly features it has, as real
// questions do). Deterministic.
func variedPrompts(n, size int) []string {
	rows, _ := ReadRows(fixture)
	var words []string
	for _, r := range rows {
		words = append(words, strings.Fields(r.Text)...)
	}
	rng := rand.New(rand.NewPCG(7, 11))
	zipf := rand.NewZipf(rng, 1.1, 1, 200000-1)
	syll := []string{"ka", "tor", "mi", "ne", "sul", "ra", "phe", "ion", "lo", "quen", "ter", "ba", "dy", "ox", "gra", "vis"}
	pseudo := func(i uint64) string {
		var sb strings.Builder
		for h := mix(uint32(i)+1) | 1<<31; h > 1; h >>= 4 {
			sb.WriteString(syll[h&15])
			if sb.Len() > 4 && h&0x30 == 0 {
				break
			}
		}
		return sb.String()
	}
	out := make([]string, n)
	for i := range out {
		var sb strings.Builder
		for j := rng.IntN(len(words)); sb.Len() < size; j = (j + 1) % len(words) {
			if rng.IntN(4) == 0 {
				sb.WriteString(pseudo(zipf.Uint64()))
			} else {
				sb.WriteString(words[j])
			}
			sb.WriteByte(' ')
			if rng.IntN(200) == 0 {
				j = rng.IntN(len(words)) // another question
			}
		}
		out[i] = sb.String()[:size]
	}
	return out
}

var (
	exampleOnce  sync.Once
	exampleModel *Linear
)

// benchPercentiles calls Predict of the committed example model over prompts in turn and
// reports the median and 99th percentile of one call's thread CPU time (cpuClock): on a
// shared machine, time spent waiting for the core is not the classifier's.
func benchPercentiles(b *testing.B, prompts []string) {
	exampleOnce.Do(func() {
		m, err := Load(exampleModelPath)
		if err != nil {
			b.Fatal(err)
		}
		exampleModel = m
	})
	m := exampleModel
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var lat []int64
	i := 0
	for b.Loop() {
		t0 := threadCPU()
		m.Predict(prompts[i%len(prompts)])
		lat = append(lat, threadCPU()-t0)
		i++
	}
	slices.Sort(lat)
	at := func(q float64) float64 { return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))]) }
	b.ReportMetric(at(0.50), "p50-"+cpuClock+"-ns")
	b.ReportMetric(at(0.99), "p99-"+cpuClock+"-ns")
}

// BenchmarkLinearPredictVaried2KB is the 2 KB prompt over 512 different prompts
// (target ≤ 50 µs p99).
func BenchmarkLinearPredictVaried2KB(b *testing.B) {
	benchPercentiles(b, variedPrompts(512, 2<<10))
}

// BenchmarkLinearPredictVaried220KB is the 220 KB conversation over 64 different ones
// (target ≤ 300 µs p99): the window bounds what is read.
func BenchmarkLinearPredictVaried220KB(b *testing.B) {
	benchPercentiles(b, variedPrompts(64, 220<<10))
}
