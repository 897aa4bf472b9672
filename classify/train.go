package classify

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
)

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
	// NB, when positive, scales each feature's input to label c by the naive-Bayes
	// log-count ratio r_c = ln((p_c/‖p_c‖₁) / (q_c/‖q_c‖₁)), p_c and q_c the smoothed
	// (by NB) counts of texts with the feature in label c and in the other labels: the
	// NB-LR of Wang and Manning, "Baselines and Bigrams", ACL 2012, §2.2, with a softmax
	// in place of one-vs-rest. The ratios are folded into the saved weights, so it costs
	// nothing at prediction.
	NB float64
	// MaxRows, when positive, keeps only the rows (features) with the largest weight
	// magnitude: the model file and its memory shrink in proportion.
	MaxRows int
	// Seed fixes the shuffle of every epoch: the same rows and options give the same model.
	Seed uint64
}

// DefaultTrainOptions are the options `kvroute classify train` uses unless told otherwise.
func DefaultTrainOptions() TrainOptions {
	return TrainOptions{Features: DefaultFeatures(), Epochs: 12, LearningRate: 1, Balanced: true,
		NB: 0.5, Seed: 1}
}

// Row is one labelled text.
type Row struct {
	Text  string `json:"text"`
	Label string `json:"label"`
}

// sparse is one training text: its distinct features and their tf-idf values.
type sparse struct {
	idx []uint32
	val []float32
}

// Train fits a Linear to rows by stochastic gradient descent on the softmax cross-entropy,
// single-threaded and seeded, so it is deterministic. Labels are sorted by name. It fails
// on no rows, fewer than two labels or more than MaxLabels.
func Train(rows []Row, opt TrainOptions) (*Linear, error) {
	if len(rows) == 0 {
		return nil, errors.New("classify: no training rows")
	}
	if opt.Epochs < 1 || opt.LearningRate <= 0 || opt.NB < 0 || opt.MaxRows < 0 {
		return nil, fmt.Errorf("classify: epochs %d, learning rate %g must be positive; nb %g, max rows %d not negative",
			opt.Epochs, opt.LearningRate, opt.NB, opt.MaxRows)
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
	k, d := len(labels), 1<<opt.Features.Bits
	// distinct features and counts of every text, computed once.
	xs := make([]sparse, len(rows))
	ys := make([]int, len(rows))
	df := make([]int32, d)
	g := &grouper{}
	for i, r := range rows {
		g.occ = opt.Features.Append(g.occ[:0], r.Text)
		g.group(opt.Features.Bits)
		x := sparse{idx: append([]uint32(nil), g.keys...), val: make([]float32, len(g.keys))}
		for j, f := range g.keys {
			x.val[j] = sublinear(g.counts[j])
			df[f]++
		}
		xs[i], ys[i] = x, idx[r.Label]
	}
	n := float64(len(rows))
	idf := make([]float32, d)
	for f, c := range df {
		idf[f] = float32(math.Log((1+n)/(1+float64(c))) + 1)
	}
	for _, x := range xs {
		var norm float32
		for j, f := range x.idx {
			x.val[j] *= idf[f]
			norm += x.val[j] * x.val[j]
		}
		if norm > 0 {
			inv := 1 / float32(math.Sqrt(float64(norm)))
			for j := range x.val {
				x.val[j] *= inv
			}
		}
	}
	var ratio []float32
	if opt.NB > 0 {
		ratio = nbRatios(xs, ys, k, d, opt.NB)
	}
	w, b := sgd(xs, ys, k, d, ratio, opt)
	if ratio != nil {
		for i := range w {
			w[i] *= ratio[i]
		}
	}
	m := compact(w, b, idf, k, opt.MaxRows)
	m.Features, m.Labels = opt.Features, labels
	m.IDFDefault = float32(math.Log(1+n) + 1)
	m.index()
	return m, nil
}

// nbRatios returns the log-count ratio of every feature and label (W's layout), from
// binarized counts smoothed by alpha.
func nbRatios(xs []sparse, ys []int, k, d int, alpha float64) []float32 {
	p := make([]float32, d*k)
	all := make([]float32, d)
	tot := make([]float64, k)
	var totAll float64
	for i, x := range xs {
		for _, f := range x.idx {
			p[int(f)*k+ys[i]]++
			all[f]++
		}
		tot[ys[i]] += float64(len(x.idx))
		totAll += float64(len(x.idx))
	}
	r := make([]float32, d*k)
	for f := 0; f < d; f++ {
		if all[f] == 0 {
			continue // no text has it: its weights stay 0 whatever the ratio
		}
		for c := 0; c < k; c++ {
			pc := (float64(p[f*k+c]) + alpha) / (tot[c] + alpha*float64(d))
			qc := (float64(all[f]-p[f*k+c]) + alpha) / (totAll - tot[c] + alpha*float64(d))
			r[f*k+c] = float32(math.Log(pc / qc))
		}
	}
	return r
}

// sgd fits softmax weights (d×k) and biases to xs; with ratio, feature f's input to label
// c is x_f·ratio[f*k+c].
func sgd(xs []sparse, ys []int, k, d int, ratio []float32, opt TrainOptions) ([]float32, []float32) {
	w, b := make([]float32, d*k), make([]float32, k)
	weight := make([]float64, k)
	count := make([]int, k)
	for _, y := range ys {
		count[y]++
	}
	for c := range weight {
		weight[c] = 1
		if opt.Balanced {
			weight[c] = float64(len(ys)) / float64(k*count[c])
		}
	}
	order := make([]int, len(xs))
	for i := range order {
		order[i] = i
	}
	rng := rand.New(rand.NewPCG(opt.Seed, 0x6b76726f757465))
	s := make([]float32, k)
	p := make([]float64, k)
	gr := make([]float32, k)
	total := float64(opt.Epochs * len(xs))
	step := 0
	for e := 0; e < opt.Epochs; e++ {
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, i := range order {
			lr := opt.LearningRate * (1 - float64(step)/total)
			step++
			x := xs[i]
			copy(s, b)
			for j, f := range x.idx {
				row := w[int(f)*k : int(f)*k+k]
				if ratio != nil {
					rr := ratio[int(f)*k : int(f)*k+k]
					for c, v := range row {
						s[c] += v * x.val[j] * rr[c]
					}
					continue
				}
				for c, v := range row {
					s[c] += v * x.val[j]
				}
			}
			softmax(s, p)
			for c := range gr {
				t := 0.0
				if c == ys[i] {
					t = 1
				}
				gr[c] = float32(lr * weight[ys[i]] * (t - p[c]))
				b[c] += gr[c]
			}
			decay := float32(1 - lr*opt.L2)
			for j, f := range x.idx {
				row := w[int(f)*k : int(f)*k+k]
				for c := range row {
					gx := gr[c] * x.val[j]
					if ratio != nil {
						gx *= ratio[int(f)*k+c]
					}
					row[c] = row[c]*decay + gx
				}
			}
		}
	}
	return w, b
}

// compact keeps the rows of w with a non-zero weight (the maxRows of largest magnitude,
// when positive), in bucket order.
func compact(w, b, idf []float32, k, maxRows int) *Linear {
	type cand struct {
		f   uint32
		mag float32
	}
	var cs []cand
	for f := 0; f*k < len(w); f++ {
		var mag float32
		for _, v := range w[f*k : f*k+k] {
			mag = max(mag, float32(math.Abs(float64(v))))
		}
		if mag > 0 {
			cs = append(cs, cand{uint32(f), mag})
		}
	}
	if maxRows > 0 && len(cs) > maxRows {
		sort.SliceStable(cs, func(i, j int) bool { return cs[i].mag > cs[j].mag })
		cs = cs[:maxRows]
		sort.Slice(cs, func(i, j int) bool { return cs[i].f < cs[j].f })
	}
	m := &Linear{Buckets: make([]uint32, len(cs)), W: make([]float32, len(cs)*k),
		IDF: make([]float32, len(cs)), B: b}
	for i, c := range cs {
		m.Buckets[i] = c.f
		copy(m.W[i*k:i*k+k], w[int(c.f)*k:int(c.f)*k+k])
		m.IDF[i] = idf[c.f]
	}
	return m
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
