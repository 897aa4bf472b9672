package classify

import (
	"math"
	"sync"
)

// Linear is a multinomial logistic regression (softmax) over hashed tf-idf features.
// A text's distinct feature indices f with counts tf_f give the vector
//
//	x_f = (1 + ln tf_f) · idf_f / ‖(1 + ln tf) · idf‖₂
//
// (sublinear tf and l2 normalization: Manning, Raghavan and Schütze, "Introduction to
// Information Retrieval", §6.4.1 and §6.4.4), and the label scores
// score_c = b_c + Σ_f x_f · W[f][c], P(c | text) = exp(score_c) / Σ_k exp(score_k)
// (Bishop, "Pattern Recognition and Machine Learning", §4.3.4).
//
// Only features with a row (Buckets) carry weights and their own idf; every other
// feature weighs IDFDefault in the norm and nothing in the scores, so a pruned model
// reads a text as the full one does. A Linear is read-only once built and safe for
// concurrent use.
type Linear struct {
	Features Features
	Labels   []string
	// Buckets[i] is the hashed feature index of row i, strictly increasing.
	Buckets []uint32
	// W holds len(Labels) weights per row: W[i*K+c].
	W []float32
	// IDF[i] is row i's inverse document frequency, ln((1+N)/(1+df)) + 1 over the N
	// training texts; IDFDefault is that of a feature no training text had.
	IDF        []float32
	IDFDefault float32
	// B holds one bias per label.
	B []float32

	rowOf []int32 // hashed feature index → row, -1 for none; built by index
}

// Prediction is a classification: the best label, its probability and every label's.
type Prediction struct {
	Label      string
	Confidence float64
	// Probs[i] is the probability of Labels[i]; it is nil from Predict.
	Probs []float64
}

// MaxLabels bounds the label set of a model (scores are kept on the stack).
const MaxLabels = 256

// index builds the feature → row table (4 bytes per hashed feature: 4 MiB at 2^20).
func (m *Linear) index() {
	m.rowOf = make([]int32, 1<<m.Features.Bits)
	for i := range m.rowOf {
		m.rowOf[i] = -1
	}
	for i, b := range m.Buckets {
		m.rowOf[b] = int32(i)
	}
}

// grouper counts a text's feature occurrences by open addressing with a generation
// stamp, so no table is cleared between texts.
type grouper struct {
	gen    uint32
	slots  []gslot
	occ    []uint32
	keys   []uint32
	counts []uint32
}

type gslot struct{ gen, key, idx uint32 }

var grouperPool = sync.Pool{New: func() any { return &grouper{occ: make([]uint32, 0, 8192)} }}

// group fills g.keys (first-seen order) and g.counts from g.occ.
func (g *grouper) group() {
	size := 1024
	for size < 2*len(g.occ) {
		size <<= 1
	}
	if len(g.slots) < size {
		g.slots, g.gen = make([]gslot, size), 0
	}
	g.gen++
	if g.gen == 0 {
		clear(g.slots)
		g.gen = 1
	}
	g.keys, g.counts = g.keys[:0], g.counts[:0]
	mask := uint32(len(g.slots) - 1)
	for _, f := range g.occ {
		for j := f & mask; ; j = (j + 1) & mask {
			s := &g.slots[j]
			if s.gen != g.gen {
				*s = gslot{gen: g.gen, key: f, idx: uint32(len(g.keys))}
				g.keys = append(g.keys, f)
				g.counts = append(g.counts, 1)
				break
			}
			if s.key == f {
				g.counts[s.idx]++
				break
			}
		}
	}
}

// sublinearTF[n] is 1 + ln n for the counts a text usually has.
var sublinearTF = func() (t [256]float32) {
	for n := 1; n < len(t); n++ {
		t[n] = float32(1 + math.Log(float64(n)))
	}
	return t
}()

func sublinear(n uint32) float32 {
	if n < uint32(len(sublinearTF)) {
		return sublinearTF[n]
	}
	return float32(1 + math.Log(float64(n)))
}

// scores writes the label scores of text into out (len K).
func (m *Linear) scores(text string, out []float32) {
	g := grouperPool.Get().(*grouper)
	g.occ = m.Features.Append(g.occ[:0], text)
	g.group()
	k := len(m.Labels)
	clear(out)
	var norm float32
	for i, f := range g.keys {
		x := sublinear(g.counts[i])
		r := m.rowOf[f]
		if r < 0 {
			x *= m.IDFDefault
			norm += x * x
			continue
		}
		x *= m.IDF[r]
		norm += x * x
		row := m.W[int(r)*k : int(r)*k+k]
		for c, w := range row {
			out[c] += w * x
		}
	}
	grouperPool.Put(g)
	inv := float32(0)
	if norm > 0 {
		inv = 1 / float32(math.Sqrt(float64(norm)))
	}
	for c := range out {
		out[c] = out[c]*inv + m.B[c]
	}
}

// Predict classifies text: the best label and its softmax probability. Cost is linear in
// min(len(text), Features.WindowBytes) and in the label count; it does not allocate.
func (m *Linear) Predict(text string) Prediction {
	var buf [MaxLabels]float32
	s := buf[:len(m.Labels)]
	m.scores(text, s)
	best := 0
	for c := range s {
		if s[c] > s[best] {
			best = c
		}
	}
	var z float64
	for c := range s {
		z += math.Exp(float64(s[c] - s[best]))
	}
	return Prediction{Label: m.Labels[best], Confidence: 1 / z}
}

// PredictAll is Predict with every label's probability in Probs.
func (m *Linear) PredictAll(text string) Prediction {
	var buf [MaxLabels]float32
	s := buf[:len(m.Labels)]
	m.scores(text, s)
	probs := softmax(s, make([]float64, len(s)))
	best := 0
	for c := range probs {
		if probs[c] > probs[best] {
			best = c
		}
	}
	return Prediction{Label: m.Labels[best], Confidence: probs[best], Probs: probs}
}

func softmax(s []float32, out []float64) []float64 {
	max := s[0]
	for _, v := range s {
		if v > max {
			max = v
		}
	}
	var z float64
	for c, v := range s {
		out[c] = math.Exp(float64(v - max))
		z += out[c]
	}
	for c := range out {
		out[c] /= z
	}
	return out
}
