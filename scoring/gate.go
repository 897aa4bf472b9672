package scoring

import "math"

// Learning can only help: learned factors enter the prediction only to the degree they
// have predicted the observed TTFTs better, in seconds, than what they would replace.
//
// Every first token is scored before it updates anything (prequential evaluation,
// Dawid 1984, "Statistical theory: the prequential approach", JRSS A 147(2)): the
// baseline's prediction ŷ_b (the prior, factors 1, for the pool's factors; the gated
// pool's factors for a worker's deviation from them, pool.go) and, per term, how far the
// learned factors' prediction departs from it, d_t = (θ_t − θ_b,t)·z_t (seconds, z the
// features). The prediction uses
//
//	θ_used,t = θ_b,t + w_t·(θ_t − θ_b,t)
//
// (for a term priced at another's rate, the queue at the prefill's, the rate's weight
// carries the rate's part: rateOf, departures, combine) with w the least-squares
// combination weights of the forecasts (Bates & Granger 1969,
// "The combination of forecasts", Oper. Res. Q. 20(4); one weight per term, as in
// forecast-encompassing regressions): regress the baseline's error e = y − ŷ_b on the
// departures d through the origin, with exponential forgetting λ (gateForgetting),
//
//	ŵ = A⁻¹·b,   A = Σ λ^(n−k)·d_k·d_kᵀ,   b = Σ λ^(n−k)·e_k·d_k
//	w_t = clamp(ŵ_t − gateZ·SE_t, 0, 1),    SE_t² = (A⁻¹·S·A⁻¹)_tt
//
// — each weight's one-sided lower confidence bound. S is the Newey–West (1987,
// Econometrica 55(3)) heteroskedasticity- and autocorrelation-consistent estimate of
// the scores' covariance, g_k = d_k·r_k with r_k = e_k − ŵ_(k−1)·d_k the residual the
// combination made before learning from k (a recursive residual):
//
//	S = Σ λ^(n−k)·[g_k·g_kᵀ + Σ_(l=1..L) (1 − l/(L+1))·(g_k·g_(k−l)ᵀ + g_(k−l)·g_kᵀ)]
//
// TTFT errors are neither homoskedastic (a 5 s TTFT errs by more than a 0.2 s one) nor
// independent (consecutive picks see the same queues), so the textbook s²·A⁻¹ calls
// chance improvements significant.
//
// The loss is squared error in seconds, not the relative error RLS minimizes: a pick
// compares workers' TTFTs in seconds. A term whose departure never varied, or varies
// only together with another's (collinear: overhead against a small queue), has a
// large standard error and stays at its baseline: only what the observations identify
// enters. Where the baseline predicts as well, ŵ ≈ 0 ± SE and w = 0: the prediction IS
// the baseline's. Where it is wrong (a worker twice as slow), e ≈ d, ŵ ≈ 1 and the
// learned factors enter in full.
//
// Only the picked worker is observed (selection bias): a worker the combined model
// over-rates is picked and its errors are seen, so an optimistic prior corrects itself;
// a worker the learned model wrongly calls slow is not picked, its deviation decays to
// the pool's (pool.go) and exploration still observes it.
type gate struct {
	n    float64                     // Σ λ^(n−k), observations scored
	b    [NumTerms]float64           // Σ λ·e·d
	a    [NumTerms][NumTerms]float64 // Σ λ·d·dᵀ
	s    [NumTerms][NumTerms]float64 // Newey–West S
	lags [gateLags][NumTerms]float64 // the last gateLags scores g, newest first
	w    [NumTerms]float64           // the weights as of the last add (weights)
}

// gateZ is the one-sided normal quantile of the lower bound (97.7 %): learned factors
// enter only once they beat the baseline by two standard errors.
const gateZ = 2

// gateLags is L, the Newey–West bandwidth: ⌊4·(n/100)^(2/9)⌋ (Newey & West 1994) is
// 4–5 for the ≈ 100–1,000 observations the gate remembers.
const gateLags = 4

// gateForgetting is the gate's forgetting factor λ: its evidence spans ≈ 1,000
// observations, ten times the factors' own memory (Options.Forgetting = 0.99), so a
// short run of lucky residuals does not open it. A regime change still opens it within
// a few observations: the regression through the origin is dominated by the large
// departures the change brings (the small ones before it weigh little in A).
const gateForgetting = 0.999

// gateMinDD is the A_tt (seconds²) below which a term's departure is too small to be
// scored (weight 0, left out of the regression).
const gateMinDD = 1e-12

// add scores one observation: the baseline's error e = y − ŷ_b and each term's
// departure of the learned prediction from the baseline's d, seconds.
func (g *gate) add(e float64, d [NumTerms]float64) {
	if math.IsNaN(e) || math.IsInf(e, 0) {
		return
	}
	for _, v := range d {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return
		}
	}
	const lambda = gateForgetting
	r := e
	if idx, wh, _ := g.solve(); len(idx) > 0 {
		for k, t := range idx {
			r -= wh[k] * d[t]
		}
	}
	var sc [NumTerms]float64
	for t := range sc {
		sc[t] = d[t] * r
	}
	g.n = lambda*g.n + 1
	for i := range d {
		g.b[i] = lambda*g.b[i] + e*d[i]
		for j := range d {
			g.a[i][j] = lambda*g.a[i][j] + d[i]*d[j]
			v := sc[i] * sc[j]
			for l := range g.lags {
				v += (1 - float64(l+1)/(gateLags+1)) * (sc[i]*g.lags[l][j] + g.lags[l][i]*sc[j])
			}
			g.s[i][j] = lambda*g.s[i][j] + v
		}
	}
	copy(g.lags[1:], g.lags[:gateLags-1])
	g.lags[0] = sc
	g.w = g.compute()
}

// weights are w_t in [0, 1] per term as of the last observation (O(1): a pick reads
// them once per candidate).
func (g *gate) weights() [NumTerms]float64 { return g.w }

// solve returns the scored terms (A_tt > gateMinDD), ŵ on them and A⁻¹ restricted to
// them; none when A is singular there or fewer than two observations per term.
func (g *gate) solve() (idx []int, wh [NumTerms]float64, inv [NumTerms][NumTerms]float64) {
	for t := range g.a {
		if g.a[t][t] > gateMinDD {
			idx = append(idx, t)
		}
	}
	k := len(idx)
	if k == 0 || g.n < 2*float64(k) {
		return nil, wh, inv
	}
	// Gauss–Jordan with partial pivoting on [A | I], k ≤ NumTerms.
	var m [NumTerms][2 * NumTerms]float64
	for r, i := range idx {
		for c, j := range idx {
			m[r][c] = g.a[i][j]
		}
		m[r][k+r] = 1
	}
	for c := 0; c < k; c++ {
		piv := c
		for r := c + 1; r < k; r++ {
			if math.Abs(m[r][c]) > math.Abs(m[piv][c]) {
				piv = r
			}
		}
		if math.Abs(m[piv][c]) <= gateMinDD*1e-6 {
			return nil, wh, inv
		}
		m[c], m[piv] = m[piv], m[c]
		p := 1 / m[c][c]
		for j := range 2 * k {
			m[c][j] *= p
		}
		for r := 0; r < k; r++ {
			if f := m[r][c]; r != c && f != 0 {
				for j := range 2 * k {
					m[r][j] -= f * m[c][j]
				}
			}
		}
	}
	for r := 0; r < k; r++ {
		for c := 0; c < k; c++ {
			inv[r][c] = m[r][k+c]
			wh[r] += inv[r][c] * g.b[idx[c]]
		}
	}
	return idx, wh, inv
}

// compute returns w_t in [0, 1] per term: 0 until the term's learned departure has
// beaten the baseline significantly, and for a term the observations do not identify.
func (g *gate) compute() [NumTerms]float64 {
	var w [NumTerms]float64
	idx, wh, inv := g.solve()
	for r, t := range idx {
		v := 0.0 // (A⁻¹·S·A⁻¹)_rr
		for i, ti := range idx {
			for j, tj := range idx {
				v += inv[r][i] * g.s[ti][tj] * inv[j][r]
			}
		}
		lo := wh[r] - gateZ*math.Sqrt(max(v, 0))
		if math.IsNaN(lo) {
			lo = 0
		}
		w[t] = min(max(lo, 0), 1)
	}
	return w
}

// rateOf names, per term, the term whose rate its feature is priced at (−1: its own).
// The queue's feature is the prefill work queued ahead at the prior's prefill rate
// (model.go), so a learned prefill rate is also the queue's: the gate scores the queue
// factor's departure from the prefill factor's, and the prefill factor's departure on
// both features. Gated separately, a learned prefill rate that entered while the
// queue's did not made queued prefill cheaper than one's own (Mooncake 1×: prefill
// 1.29, queue 1.0; BENCHMARKS.md "Learning that can only help").
var rateOf = [NumTerms]Term{TermOverhead: -1, TermPrefill: -1, TermQueue: TermPrefill, TermLowerTier: -1, TermDecode: -1, TermAdapter: -1}

// departures is the learned prediction's departure from the baseline's per term,
// seconds: d_t = (θ_t − base_t)·z_t for a term with its own rate; a rate shared with
// another term (rateOf) departs on both features and the term by the rest,
//
//	d_r = (θ_r − base_r)·(z_r + Σ_(t: rateOf t = r) z_t)
//	d_t = ((θ_t − base_t) − (θ_r − base_r))·z_t
//
// Σ_t d_t = (θ − base)·z either way.
func departures(theta, base *[NumTerms]float64, z Features) [NumTerms]float64 {
	var d [NumTerms]float64
	for t := range d {
		dt := theta[t] - base[t]
		if r := rateOf[t]; r >= 0 {
			dr := theta[r] - base[r]
			d[r] += dr * z[t]
			dt -= dr
		}
		d[t] += dt * z[t]
	}
	return d
}

// combine returns the factors the weights w of the departures admit between base and
// theta: θ_used·z = base·z + Σ_t w_t·d_t (departures), i.e.
//
//	θ_used,t = base_t + w_t·(θ_t − base_t)                                  own rate
//	θ_used,t = base_t + w_r·(θ_r − base_r) + w_t·((θ_t − base_t) − (θ_r − base_r))
func combine(base, theta, w [NumTerms]float64) [NumTerms]float64 {
	u := base
	for t := range u {
		dt := theta[t] - base[t]
		if r := rateOf[t]; r >= 0 {
			dr := theta[r] - base[r]
			u[t] += w[r] * dr
			dt -= dr
		}
		u[t] += w[t] * dt
	}
	return u
}

// gated returns the factors w admits between the prior (1) and theta (combine).
func gated(theta, w [NumTerms]float64) [NumTerms]float64 {
	return combine(unitTheta, theta, w)
}

// dot is Σ θ_t·z_t, seconds.
func dot(theta *[NumTerms]float64, z Features) float64 {
	s := 0.0
	for t := range theta {
		s += theta[t] * z[t]
	}
	return s
}
