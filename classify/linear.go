package classify

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
)

// Linear is a multinomial logistic regression (softmax) over hashed features: for a
// text with feature indices f_1..f_n, score_c = b_c + (1/√n)·Σ_i W[f_i][c] and
// P(c | text) = exp(score_c) / Σ_k exp(score_k) (Bishop, "Pattern Recognition and Machine
// Learning", §4.3.4). The 1/√n scaling gives every text a unit-norm feature vector when its
// features are distinct. A Linear is read-only once built and safe for concurrent use.
type Linear struct {
	Features Features
	Labels   []string
	// W holds one row of len(Labels) weights per hashed feature: W[f*K+c].
	W []float32
	// B holds one bias per label.
	B []float32
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

var featPool = sync.Pool{New: func() any { b := make([]uint32, 0, 8192); return &b }}

// scores writes the label scores of text into out (len K).
func (m *Linear) scores(text string, out []float32) {
	bp := featPool.Get().(*[]uint32)
	feats := m.Features.Append((*bp)[:0], text)
	m.scoreFeats(feats, out)
	*bp = feats[:0]
	featPool.Put(bp)
}

func (m *Linear) scoreFeats(feats []uint32, out []float32) {
	k := len(m.Labels)
	for c := range out {
		out[c] = 0
	}
	for _, f := range feats {
		row := m.W[int(f)*k : int(f)*k+k]
		for c, w := range row {
			out[c] += w
		}
	}
	scale := float32(1)
	if len(feats) > 0 {
		scale = 1 / float32(math.Sqrt(float64(len(feats))))
	}
	for c := range out {
		out[c] = out[c]*scale + m.B[c]
	}
}

// Predict classifies text: the best label and its softmax probability. Cost is linear in
// min(len(text), Features.WindowBytes) and in the label count.
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

// TrainOptions are the knobs of Train.
type TrainOptions struct {
	Features Features
	// Epochs is the number of passes over the rows (≥ 1).
	Epochs int
	// LearningRate is the initial SGD step; it decays linearly to 0 over the run, as in
	// fastText's trainer (src/fasttext.cc, "lr * (1 - progress)").
	LearningRate float64
	// L2 is the weight decay per example on the weights a step touches (0 turns it off).
	L2 float64
	// Balanced weighs each row's gradient by N/(K·count(label)), so a rare label counts
	// as much as a common one (King and Zeng, "Logistic Regression in Rare Events Data",
	// 2001, §4.2): it trades a little accuracy for macro-F1.
	Balanced bool
	// Seed fixes the shuffle of every epoch: the same rows and options give the same model.
	Seed uint64
}

// DefaultTrainOptions are the options `kvroute classify train` uses unless told otherwise.
func DefaultTrainOptions() TrainOptions {
	return TrainOptions{Features: DefaultFeatures(), Epochs: 12, LearningRate: 0.5, L2: 0.003, Balanced: true, Seed: 1}
}

// Row is one labelled text.
type Row struct {
	Text  string `json:"text"`
	Label string `json:"label"`
}

// Train fits a Linear to rows by stochastic gradient descent on the softmax cross-entropy,
// single-threaded and seeded, so it is deterministic. Labels are sorted by name. It fails
// on no rows, fewer than two labels or more than MaxLabels.
func Train(rows []Row, opt TrainOptions) (*Linear, error) {
	if len(rows) == 0 {
		return nil, errors.New("classify: no training rows")
	}
	if opt.Epochs < 1 || opt.LearningRate <= 0 {
		return nil, fmt.Errorf("classify: epochs %d and learning rate %g must be positive", opt.Epochs, opt.LearningRate)
	}
	if err := opt.Features.validate(); err != nil {
		return nil, err
	}
	labels := labelSet(rows)
	if len(labels) < 2 || len(labels) > MaxLabels {
		return nil, fmt.Errorf("classify: %d labels, want 2..%d", len(labels), MaxLabels)
	}
	idx := make(map[string]int, len(labels))
	for i, l := range labels {
		idx[l] = i
	}
	k := len(labels)
	m := &Linear{Features: opt.Features, Labels: labels,
		W: make([]float32, (1<<opt.Features.Bits)*k), B: make([]float32, k)}
	// feature lists are computed once: the epochs then only touch weights.
	feats := make([][]uint32, len(rows))
	ys := make([]int, len(rows))
	for i, r := range rows {
		feats[i] = opt.Features.Append(nil, r.Text)
		ys[i] = idx[r.Label]
	}
	weight := make([]float64, k)
	for c := range weight {
		weight[c] = 1
	}
	if opt.Balanced {
		count := make([]int, k)
		for _, y := range ys {
			count[y]++
		}
		for c := range weight {
			weight[c] = float64(len(rows)) / float64(k*count[c])
		}
	}
	order := make([]int, len(rows))
	for i := range order {
		order[i] = i
	}
	rng := rand.New(rand.NewPCG(opt.Seed, 0x6b76726f757465))
	s := make([]float32, k)
	p := make([]float64, k)
	g := make([]float32, k)
	total := float64(opt.Epochs * len(rows))
	step := 0
	decay := float32(1)
	for e := 0; e < opt.Epochs; e++ {
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, i := range order {
			lr := opt.LearningRate * (1 - float64(step)/total)
			step++
			f := feats[i]
			m.scoreFeats(f, s)
			softmax(s, p)
			for c := range g {
				t := 0.0
				if c == ys[i] {
					t = 1
				}
				g[c] = float32(lr * weight[ys[i]] * (t - p[c]))
				m.B[c] += g[c]
			}
			scale := float32(1)
			if len(f) > 0 {
				scale = 1 / float32(math.Sqrt(float64(len(f))))
			}
			if opt.L2 > 0 {
				decay = float32(1 - lr*opt.L2)
			}
			for _, fi := range f {
				row := m.W[int(fi)*k : int(fi)*k+k]
				for c := range row {
					row[c] = row[c]*decay + g[c]*scale
				}
			}
		}
	}
	return m, nil
}

func (f Features) validate() error {
	switch {
	case f.Bits < 10 || f.Bits > 24:
		return fmt.Errorf("classify: feature bits %d, want 10..24", f.Bits)
	case f.WordNgrams < 1 || f.WordNgrams > 2:
		return fmt.Errorf("classify: word n-grams %d, want 1 or 2", f.WordNgrams)
	case f.CharMax != 0 && (f.CharMin < 1 || f.CharMin > f.CharMax || f.CharMax > 8):
		return fmt.Errorf("classify: char n-grams %d..%d, want 1 ≤ min ≤ max ≤ 8 (or max 0)", f.CharMin, f.CharMax)
	case f.WindowBytes < 0:
		return fmt.Errorf("classify: window %d bytes is negative", f.WindowBytes)
	}
	return nil
}

func labelSet(rows []Row) []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range rows {
		if !seen[r.Label] {
			seen[r.Label] = true
			out = append(out, r.Label)
		}
	}
	sortStrings(out)
	return out
}
