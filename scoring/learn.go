package scoring

import "math"

// rls is a recursive-least-squares estimator with exponential forgetting for the
// per-term factors θ of one worker (Ljung & Söderström, "Theory and Practice of
// Recursive Identification", 1983, §2.6). It minimizes the forgetting-weighted sum of
// squared *relative* errors Σ λ^(n−k)·(1 − θ·z_k/y_k)², so that a 20 s TTFT does not
// drown a 50 ms one: the regressor is φ = z/y and the target is 1.
//
// Robustness and bounds:
//   - the residual is clipped to ±clip before the update (Huber-style), so one stall
//     (GC pause, preemption) moves θ by a bounded step;
//   - the covariance trace is capped at its initial value: a term that never varies
//     (no CPU tier, no running decodes) would otherwise grow P by 1/λ per step
//     ("covariance wind-up") and jump on its first excitation;
//   - θ is clamped to [1/clampFactor, clampFactor] after each update.
type rls struct {
	theta [NumTerms]float64
	p     [NumTerms][NumTerms]float64
	n     int // observations learned
}

// rlsP0 is the initial covariance diagonal: a prior standard deviation of 1 on each
// factor (i.e. "the prior may be off by 100%").
const rlsP0 = 1.0

func newRLS() *rls {
	r := &rls{theta: unitTheta}
	for i := range r.p {
		r.p[i][i] = rlsP0
	}
	return r
}

// update learns from one observation: features z (seconds under the prior) and the
// observed TTFT y (seconds, > 0). It returns the relative residual used (after
// clipping) and whether it was clipped.
//
// Only the terms the observation identifies move: a term whose feature is zero (no
// queue ahead, no running decodes, no lower-tier hit) keeps its factor, although RLS
// would move it through its covariance with the excited terms — that correlation is
// what let identical workers' factors drift apart on terms they rarely saw.
func (r *rls) update(z Features, y, lambda, clip, clampFactor float64) (e float64, clipped bool) {
	var phi [NumTerms]float64
	for i := range phi {
		phi[i] = z[i] / y
	}
	pred := 0.0
	for i := range phi {
		pred += r.theta[i] * phi[i]
	}
	e = 1 - pred
	if e > clip {
		e, clipped = clip, true
	} else if e < -clip {
		e, clipped = -clip, true
	}
	var pphi [NumTerms]float64 // P·φ
	for i := range pphi {
		for j := range phi {
			pphi[i] += r.p[i][j] * phi[j]
		}
	}
	den := lambda
	for i := range phi {
		den += phi[i] * pphi[i]
	}
	if den <= 0 || math.IsNaN(den) || math.IsInf(den, 0) {
		return e, clipped
	}
	for i := range r.theta {
		if phi[i] == 0 {
			continue
		}
		k := pphi[i] / den
		r.theta[i] += k * e
	}
	// P ← (P − P·φ·φᵀ·P / den) / λ, kept symmetric.
	tr := 0.0
	for i := range r.p {
		for j := range r.p[i] {
			r.p[i][j] = (r.p[i][j] - pphi[i]*pphi[j]/den) / lambda
		}
		tr += r.p[i][i]
	}
	if maxTr := rlsP0 * float64(NumTerms); tr > maxTr {
		s := maxTr / tr
		for i := range r.p {
			for j := range r.p[i] {
				r.p[i][j] *= s
			}
		}
	}
	lo, hi := 1/clampFactor, clampFactor
	for i := range r.theta {
		if math.IsNaN(r.theta[i]) {
			r.theta[i] = 1
		}
		r.theta[i] = min(max(r.theta[i], lo), hi)
	}
	r.n++
	return e, clipped
}
