package scoring

import "time"

// Scratch is working memory a caller lends to one pick at a time (Input.Scratch), so
// that the Predictor's Prepare and Pick over n candidates allocate nothing per
// candidate: their per-candidate slices live in it, grown to the largest n seen and
// reused by the next pick. At 1,000 candidates a pick used to allocate ≈ 0.6 MB of
// such slices, and the garbage collections they drove set the pick's p99.
//
// With a Scratch, the Decision's Predictions live in it: valid until the Scratch is
// used for another Input. One Scratch serves one pick at a time (a Prepare, then the
// Picks of the same Input); concurrent picks need one each. The zero value is ready.
type Scratch struct {
	prep   prepared
	preds  []Prediction
	st     []candState
	writes []float64
	cost   []time.Duration
	ex     []time.Duration // exploration's costs
	cached []int
	ties   []int
}

// Reset drops what s points at (worker models and names of its last pick), keeping its
// arrays: for a Scratch kept in a pool between picks.
func (s *Scratch) Reset() {
	clear(s.prep.wms)
	clear(s.prep.names)
}

// scratch is in's Scratch, or a new one for this pick when the caller lent none.
func (in *Input) scratch() *Scratch {
	if in.Scratch != nil {
		return in.Scratch
	}
	return new(Scratch)
}

// grown returns s with length n, reusing its array when it is large enough. The
// elements keep whatever they held: callers assign every one.
func grown[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
