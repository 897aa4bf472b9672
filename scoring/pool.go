package scoring

import (
	"math"
	"time"
)

// Hierarchical (empirical-Bayes) factors: each worker's learned θ_w is shrunk toward
// the pool's θ̄ (one estimator fed by every worker's observations) by how much of the
// spread between workers its own estimation noise explains, and an unobserved worker's
// deviation from the pool decays with time:
//
//	θ_eff,t = θ̄_t + (1 − B_t)·d_t,        d_t = (θ_w,t − θ̄_t)·a,   a = 2^(−age_w / factor_half_life)
//	B_t     = v_t / (v_t + τ²_t),          v_t = s²_w · (a·P_w,tt + (1 − a)·P₀)
//	τ²_t    = max(0, mean_w (θ_w,t − θ̄_t)² − mean_w v_t)
//
// v_t is the variance of the worker's own estimate (RLS covariance P scaled by the
// worker's residual variance s², Ljung & Söderström 1983 §2.6); τ²_t is the
// between-worker variance, estimated by the method of moments (the James–Stein /
// Efron–Morris 1973 estimator: what the spread of the estimates shows beyond their own
// noise). Identical workers whose factors differ only by noise get τ² ≈ 0 and share the
// pool's factors; workers that really differ (a GPU twice as slow) keep their own.
// age_w is the time since the worker's last observation: a factor nobody observes
// returns to the pool's (and its covariance to the prior's, so the next observations
// re-learn it quickly) — a worker that learned a bad value and is no longer picked is
// not shut out for ever.

// poolState is the pool estimator and the between-worker variance.
type poolState struct {
	est  *rls
	tau2 [NumTerms]float64
	sums tauSums // what tau2 is computed from (updateTau2Locked)
	gate gate    // the pool's factors against the prior (gate.go)
}

// s2Alpha is the EWMA weight of one squared residual in a worker's residual variance.
const s2Alpha = 0.05

// s2Prior is the residual variance a worker starts with (10 % relative error).
const s2Prior = 0.01

// decay is a = 2^(−age/halfLife) for wm at now (1: no decay).
func (wm *workerModel) decay(now time.Time, halfLife time.Duration) float64 {
	if halfLife <= 0 || now.IsZero() || wm.lastObs.IsZero() || !now.After(wm.lastObs) {
		return 1
	}
	return math.Exp2(-float64(now.Sub(wm.lastObs)) / float64(halfLife))
}

// effective returns the factors a prediction for wm uses at now, gated in two levels
// (gate.go): the pool's factors θ̄ enter the baseline by the pool's weights, and the
// worker's own (shrunk) factors θ_eff depart from that baseline by the worker's,
//
//	θ_b    = 1 + w_pool·(θ̄ − 1)
//	θ_used = θ_b + w_w·(θ_eff − θ_b)
//
// (per term; the queue's rate is the prefill's, gate.go combine),
// so a correction every worker needs is decided once, on every worker's observations,
// and only a worker whose own factors have predicted better than the baseline keeps
// them (a GPU twice as slow; or every worker of a pool whose workers differ so much
// that the pool's compromise fits none). A worker with no observation uses θ_b.
func (p *Predictor) effective(wm *workerModel, now time.Time) [NumTerms]float64 {
	return p.effectiveFrom(p.poolFactors(), wm, now)
}

// effectiveFrom is effective with the pool's gated factors th (poolFactors) given: a
// pick computes them once for all its candidates.
func (p *Predictor) effectiveFrom(th [NumTerms]float64, wm *workerModel, now time.Time) [NumTerms]float64 {
	if wm == nil || wm.est.n == 0 {
		return th
	}
	return combine(th, p.learned(wm, now), wm.gate.weights())
}

// poolFactors is the pool's factors gated by the pool's weight.
func (p *Predictor) poolFactors() [NumTerms]float64 {
	return gated(p.pool.est.theta, p.pool.gate.weights())
}

// learned returns wm's factors shrunk toward the pool's at now, before the gate. A
// worker with no observation uses the pool's.
func (p *Predictor) learned(wm *workerModel, now time.Time) [NumTerms]float64 {
	pool := p.pool.est.theta
	if wm == nil || wm.est.n == 0 {
		return pool
	}
	a := wm.decay(now, p.o.FactorHalfLife)
	var th [NumTerms]float64
	for t := range th {
		v := wm.s2 * (a*wm.est.p[t][t] + (1-a)*rlsP0)
		b := 1.0
		if d := v + p.pool.tau2[t]; d > 0 {
			b = v / d
		}
		th[t] = pool[t] + (1-b)*a*(wm.est.theta[t]-pool[t])
	}
	return th
}

// ageLocked applies the decay of wm's deviation and covariance up to now to its state
// (before it learns at now): θ_w ← θ̄ + a·(θ_w − θ̄), P ← a·P + (1 − a)·P₀·I (a convex
// combination of covariances, still positive semi-definite).
func (p *Predictor) ageLocked(wm *workerModel, now time.Time) {
	a := wm.decay(now, p.o.FactorHalfLife)
	if a >= 1 {
		return
	}
	pool := p.pool.est.theta
	for i := range wm.est.theta {
		wm.est.theta[i] = pool[i] + a*(wm.est.theta[i]-pool[i])
		for j := range wm.est.p[i] {
			wm.est.p[i][j] *= a
		}
		wm.est.p[i][i] += (1 - a) * rlsP0
	}
}

// tauSums is what τ² needs of the learned workers (est.n > 0), kept as running sums
// so that one learned first token updates τ² in O(terms) rather than O(workers):
// with c_w,t = θ_w,t − 1 (factors are relative to the prior, so near 1, which keeps
// the sums' cancellation small),
//
//	Σ_w (θ_w,t − θ̄_t)² = S2_t − 2·(θ̄_t − 1)·S1_t + n·(θ̄_t − 1)²
//
// S1 = Σ c, S2 = Σ c², noise = Σ s²_w·P_w,tt. A model's share leaves the sums before
// it changes (tauLeave) and enters after (tauJoin); every tauResync changes the sums
// are rebuilt by a full walk, so float drift stays bounded (amortised O(1) a change).
type tauSums struct {
	n         int
	s1, s2, v [NumTerms]float64
	changes   int // since the last full walk
}

// tauResync is how many changes (at least; the number of workers when larger) pass
// between full walks of the workers' models.
const tauResync = 4096

// tauLeave takes wm's share out of the sums (p.mu held for writing); nil or an
// unlearned model has none.
func (p *Predictor) tauLeave(wm *workerModel) { p.tauShare(wm, -1) }

// tauJoin puts wm's share into the sums (p.mu held for writing).
func (p *Predictor) tauJoin(wm *workerModel) { p.tauShare(wm, 1) }

func (p *Predictor) tauShare(wm *workerModel, sign float64) {
	if wm == nil || wm.est.n == 0 {
		return
	}
	a := &p.pool.sums
	a.n += int(sign)
	for t := range a.s1 {
		c := wm.est.theta[t] - 1
		a.s1[t] += sign * c
		a.s2[t] += sign * c * c
		a.v[t] += sign * wm.s2 * wm.est.p[t][t]
	}
	a.changes++
}

// tauWalk rebuilds the sums from every worker's model (p.mu held for writing).
// O(workers × terms).
func (p *Predictor) tauWalk() {
	p.pool.sums = tauSums{}
	for _, wm := range p.workers {
		p.tauJoin(wm)
	}
	p.pool.sums.changes = 0
}

// updateTau2Locked re-estimates the between-worker variance τ² from the workers'
// current estimates (p.mu held for writing; every change of a learned model since the
// last call went through tauLeave/tauJoin). O(terms), and a full walk every
// tauResync changes.
func (p *Predictor) updateTau2Locked() {
	a := &p.pool.sums
	if a.changes >= max(tauResync, len(p.workers)) {
		p.tauWalk()
	}
	if a.n < 2 {
		p.pool.tau2 = [NumTerms]float64{}
		return
	}
	pool := p.pool.est.theta
	n := float64(a.n)
	for t := range a.s1 {
		m := pool[t] - 1
		dev := a.s2[t] - 2*m*a.s1[t] + n*m*m
		p.pool.tau2[t] = max(0, (dev-a.v[t])/n)
	}
}
