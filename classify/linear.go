package classify

import (
	"math"
	"math/bits"
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

	packed packed // what Predict reads; built by index
}

// packed is the model as Predict reads it, laid out so that a feature costs one lookup
// in a table that stays in a core's cache and, when it has a row, one more in a table of
// compact rows:
//
//   - present has one bit per hashed feature (2^20 bits: 128 KiB) and, every 64 features,
//     the number of rows before them, so a feature's row is that count plus a popcount
//     (the rank of a succinct bitmap, Jacobson, FOCS 1989) and a feature without a row
//     is known from the bitmap alone;
//   - rows holds, per row, the K weights quantized to int8 by label (scale[c]) and the
//     idf quantized to uint8 (idfScale), stride bytes apart: 16 bytes for up to 15
//     labels, a quarter of a cache line, where float32 weights, a separate idf and a
//     4-byte row index took three cache misses. In 16-byte rows the weights are stored
//     biased by 128 (unsigned), the layout scores16 multiplies eight lanes at a time.
//
// The model file is quantized the same way, so a loaded model predicts as before.
type packed struct {
	present  []rankWord
	rows     []byte
	stride   int
	scale    []float32
	idfScale float32
	// idfMissing is IDFDefault/idfScale: a feature without a row in the norm.
	idfMissing float32
}

type rankWord struct {
	bits   uint64
	before uint32
	_      uint32
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

// index builds the packed table from Buckets, W and IDF, quantizing them as the model
// file does (int8 weights scaled per label, uint8 idf): 2^bits/4 bytes of bitmap and
// ranks and about (K+1) bytes per row.
func (m *Linear) index() {
	k := len(m.Labels)
	q := m.quantizer()
	p := packed{stride: k + 1, scale: q.scale, idfScale: q.idfScale}
	idfAt := k
	if k+1 <= 16 {
		p.stride, idfAt = 16, 15 // the idf last, so a row is read as [16]byte
	}
	p.idfMissing = m.IDFDefault / p.idfScale
	p.present = make([]rankWord, (1<<m.Features.Bits+63)/64)
	for _, b := range m.Buckets {
		p.present[b/64].bits |= 1 << (b % 64)
	}
	n := uint32(0)
	for i := range p.present {
		p.present[i].before = n
		n += uint32(bits.OnesCount64(p.present[i].bits))
	}
	p.rows = make([]byte, len(m.Buckets)*p.stride)
	bias := byte(0)
	if p.stride == 16 {
		bias = 128 // unsigned lanes for scores16
	}
	for r := range m.Buckets {
		row := p.rows[r*p.stride : r*p.stride+p.stride]
		for c := 0; c < idfAt; c++ {
			row[c] = bias
			if c < k {
				row[c] = q.weight(m.W[r*k+c], c) + bias
			}
		}
		row[idfAt] = q.idf(m.IDF[r])
	}
	m.packed = p
}

// row returns feature f's packed row, or nil when it has none.
func (p *packed) row(f uint32) []byte {
	w := p.present[f/64]
	bit := uint64(1) << (f % 64)
	if w.bits&bit == 0 {
		return nil
	}
	r := int(w.before) + bits.OnesCount64(w.bits&(bit-1))
	return p.rows[r*p.stride : r*p.stride+p.stride]
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

// scores writes the label scores of text into out (len K). The sums are over the
// quantized weights and idf; their scales are applied once at the end.
//
// It runs in two passes so the row loads overlap: the first finds each distinct
// feature's row from the bitmap (in cache) without a branch, the second reads the rows,
// whose addresses are all known by then, with no branch to mispredict between them.
func (m *Linear) scores(text string, out []float32) {
	g := grouperPool.Get().(*grouper)
	g.occ = m.Features.Append(g.occ[:0], text)
	g.group(m.Features.Bits)
	p := &m.packed
	hits := g.hits[:0]
	if cap(hits) < len(g.keys) {
		hits = make([]hit, len(g.keys))
	}
	hits = hits[:len(g.keys)]
	n := 0
	var missing float32 // Σ (1 + ln tf)² over the features without a row
	for i, f := range g.keys {
		tf := sublinear(g.counts[i])
		w := p.present[f/64]
		has := w.bits >> (f % 64) & 1
		hits[n] = hit{row: w.before + uint32(bits.OnesCount64(w.bits&(1<<(f%64)-1))), tf: tf}
		n += int(has)
		missing += tf * tf * float32(1-has)
	}
	hits = hits[:n]
	var norm float32
	if k := len(m.Labels); p.stride == 16 {
		norm = p.scores16(hits, out)
	} else {
		clear(out)
		for _, h := range hits {
			row := p.rows[int(h.row)*p.stride : int(h.row)*p.stride+p.stride]
			x := h.tf * float32(row[k])
			norm += x * x
			for c, w := range row[:k] {
				out[c] += float32(int8(w)) * x
			}
		}
	}
	norm += missing * p.idfMissing * p.idfMissing
	g.hits = hits
	grouperPool.Put(g)
	inv := float32(0)
	if norm > 0 {
		inv = 1 / float32(math.Sqrt(float64(norm)))
	}
	for c := range out {
		out[c] = out[c]*p.scale[c]*inv + m.B[c]
	}
}

// hit is a feature of a text with a row: the row and the feature's 1 + ln tf.
type hit struct {
	row uint32
	tf  float32
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
