package scoring

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/workers"
)

// Predictor is kvroute's own policy: it predicts every candidate's TTFT (doc.go) and
// picks the lowest (picker.go). With learning on, each observed first token refines the
// chosen worker's factors θ by recursive least squares (learn.go).
//
// Pick runs under the router lock; Observe may run concurrently with it. mu guards
// workers (the map and each model's fields); Pick holds it for reading only.
type Predictor struct {
	name  string
	o     Options
	learn bool
	m     *metrics.Scoring

	mu      sync.RWMutex
	workers map[string]*workerModel // guarded by mu
	gen     uint64                  // guarded by mu: bumped by every change of workers' entries
	pool    poolState               // guarded by mu
	reuse   reuseClock              // guarded by mu (turnover.go)
	bw      float64                 // guarded by mu: the learned transfer bandwidth, bytes/s; 0 the configured (pd.go)
}

// workerModel is what the predictor knows about one worker.
type workerModel struct {
	prior         prior      // the prior the factors are relative to; a changed profile resets them
	est           *rls       // the worker's own factors θ_w (pool.go shrinks them toward the pool's)
	s2            float64    // EWMA of squared relative residuals (the noise of est)
	gate          gate       // prequential errors of the prior and of the learned factors (gate.go)
	lastObs       time.Time  // when est last learned (Input.Now of the pick it learned from)
	foreignTokens float64    // EWMA of uncached prompt tokens of requests routed here
	writes        decayed    // uncached prompt tokens routed here, decayed by WriteHalfLife
	served        decayed    // of those, the ones whose prefill is done (first token, or completion when not streamed), same decay
	backlog       backlog    // remaining prefill of our bookings here, tokens (overload.go)
	firstTokens   recent     // when our requests here left the waiting queue (first token)
	finished      recent     // when our requests here finished
	adapters      adapterUse // LoRA adapters last used here (adapter.go); nil until the first adapter request
	decode        float64    // EWMA of our requests' decode time here (completion − first token), s; 0 until one completes
	firstDecode   time.Time  // when the first of our requests here got its first token (decodeAt before any completion)
}

// foreignAlpha is the EWMA weight of one request in foreignTokens (≈ last 20 requests).
const foreignAlpha = 0.05

// NewPredictor returns the predicted-TTFT policy; learn=false keeps the prior
// coefficients forever (the kvroute_static ablation). o should come from New (defaults).
func NewPredictor(o Options, learn bool) *Predictor {
	o = o.withDefaults()
	name := PolicyKVRoute
	if !learn {
		name = PolicyKVRouteStatic
	}
	return &Predictor{name: name, o: o, learn: learn, m: o.Metrics, workers: map[string]*workerModel{}, pool: poolState{est: newRLS()}}
}

func (p *Predictor) newWorkerModel(pr prior) *workerModel {
	return &workerModel{prior: pr, est: newRLS(), s2: s2Prior, foreignTokens: float64(p.o.ForeignRequestTokens)}
}

// Name implements Policy.
func (p *Predictor) Name() string { return p.name }

// Writes implements WriteSharer: the uncached prompt tokens this predictor routed to
// worker, decayed by Options.WriteHalfLife to now (0 for a worker it never picked).
func (p *Predictor) Writes(worker string, now time.Time) float64 {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if wm := p.workers[worker]; wm != nil {
		return wm.writes.at(now, p.o.WriteHalfLife)
	}
	return 0
}

// peerWrites is c's peer writes counted by the policy: Candidate.PeerWrites with
// Options.PeerState, else 0.
func (p *Predictor) peerWrites(c *Candidate) float64 {
	if !p.o.PeerState {
		return 0
	}
	return max(c.PeerWrites, 0)
}

// WriteHalfLife implements WriteSharer (Options.WriteHalfLife).
func (p *Predictor) WriteHalfLife() time.Duration { return p.o.WriteHalfLife }

// Predict returns the prediction for one candidate with the worker's current factors.
func (p *Predictor) Predict(in *Input, c *Candidate) Prediction {
	p.mu.RLock()
	defer p.mu.RUnlock()
	pool := p.poolFactors()
	pred, _ := p.predictLocked(in, c, nil, &pool)
	return pred
}

// candState is what one pick computed about a candidate besides its prediction.
type candState struct {
	adapter AdapterState      // the worker's state for the request's LoRA adapter
	cached  int               // cached tokens after the wait's evictions
	prefill float64           // seconds of prefill compute this request adds there (θ₁·U/ρ)
	rate    float64           // learned prefill rate, tokens/s
	theta   [NumTerms]float64 // effective factors
}

// predictLocked predicts with the worker's effective factors (p.mu held); fresh
// reports that the worker has no model for its current prior yet (first sight, or its
// profile changed). st, when non-nil, receives the pick's by-products; pool is
// p.poolFactors() (the same for every candidate: computed once per pick).
func (p *Predictor) predictLocked(in *Input, c *Candidate, st *candState, pool *[NumTerms]float64) (_ Prediction, fresh bool) {
	return p.predictWith(in, c, p.model(c), st, pool)
}

// model is c's worker's model (p.mu held); nil when it has none or c has no worker.
func (p *Predictor) model(c *Candidate) *workerModel {
	if c.Worker == nil {
		return nil
	}
	return p.workers[c.Worker.Name]
}

// predictWith is predictLocked with c's worker's model m (p.model(c)) given.
func (p *Predictor) predictWith(in *Input, c *Candidate, m *workerModel, st *candState, pool *[NumTerms]float64) (_ Prediction, fresh bool) {
	pr := priorFor(&p.o, c)
	var wm *workerModel
	if m != nil && m.prior == pr {
		wm = m
	}
	fresh = wm == nil
	theta := unitTheta
	v := workerView{foreignTokens: float64(p.o.ForeignRequestTokens), backlog: -1}
	if p.o.PeerState {
		v.leftWaiting, v.leftRunning = max(c.PeerLeft.Waiting, 0), max(c.PeerLeft.Running, 0)
	}
	if p.learn {
		theta = p.effectiveFrom(*pool, wm, in.Now)
	}
	rate := pr.prefillRate / max(theta[TermPrefill], 1e-9)
	if wm != nil {
		v.foreignTokens = wm.foreignTokens
		if p.o.QueueBacklog {
			v.backlog = wm.backlog.at(in.Now, rate)
		}
		if head, ok := wm.backlog.head(); ok && p.o.QueueBacklog {
			// Only the head of the queue can be partly done: the rest has not started
			// (an engine bound by KV space rather than compute drains slower than its
			// prefill rate, and the recursion alone would call its queue empty).
			v.backlog = max(v.backlog, float64(c.Booked.PrefillTokens)-head)
		}
		v.leftWaiting += wm.firstTokens.since(c.Load.ScrapedAt)
		v.leftRunning += wm.finished.since(c.Load.ScrapedAt)
		if p.o.KVWait {
			v.decode = wm.decodeAt(in.Now, c.Booked.Decoding)
		}
	}
	var used adapterUse
	if wm != nil {
		used = wm.adapters
	}
	as := adapterState(in, c, used)
	v.adapter = adapterCost(&p.o, as)
	f, cached := features(&p.o, in, c, pr, v)
	if st != nil {
		*st = candState{adapter: as, cached: cached, prefill: theta[TermPrefill] * f[TermPrefill], rate: rate, theta: theta}
	}
	return predict(f, &theta), fresh
}

// utilLocked is the cluster's offered prefill utilization over the candidates: the
// prefill seconds of the uncached tokens routed to them recently (decayed writes, at
// each worker's learned rate) over the candidates' capacity in the same window, scaled
// by the backlog factor max(1, O/S) when the first tokens fall behind the writes
// (O = the decayed uncached tokens routed, S = those of them served, both over the
// candidates; README "Overload"). writes, when non-nil, receives each candidate's
// decayed writes, this replica's and its peers' (the pick's tie-break and turnover
// read them): one map probe and one decay per candidate serve both.
func (p *Predictor) utilLocked(in *Input, cands []Candidate, st []candState, writes []float64) float64 {
	work, offered, served := 0.0, 0.0, 0.0
	wms := in.prepared.models(p.gen, cands)
	for i := range cands {
		c := &cands[i]
		wr := 0.0
		if c.Worker != nil {
			wr = p.peerWrites(c)
			var wm *workerModel
			if wms != nil {
				wm = wms[i]
			} else {
				wm = p.workers[c.Worker.Name]
			}
			if wm != nil {
				// O/S from this replica's own picks (peers' served tokens are not
				// shared; with peer_state their writes add to the work only).
				w := wm.writes.at(in.Now, p.o.WriteHalfLife)
				if p.o.UtilizationBacklog {
					offered += w
					served += wm.served.at(in.Now, p.o.WriteHalfLife)
				}
				if st[i].rate > 0 {
					work += (w + wr) / st[i].rate
				}
				wr += w
			}
		}
		if writes != nil {
			writes[i] = wr
		}
	}
	rho := work / (float64(len(cands)) * windowSeconds(p.o.WriteHalfLife))
	if p.o.UtilizationBacklog {
		rho *= backlogFactor(offered, served)
	}
	return rho
}

// scored is one pick's per-candidate work: predictions, their by-products, the costs
// the choice ranks by (TTFT plus the delay the pick imposes on later requests), and
// each worker's decayed writes. Its slices live in the pick's Scratch.
type scored struct {
	sc     *Scratch
	preds  []Prediction
	st     []candState
	cost   []time.Duration
	writes []float64
	pool   [NumTerms]float64 // the pool's factors (exploration)
	k      float64           // congestion factor ρ/(1−ρ)
	tau    float64           // reuse interval of the prompt's blocks (CacheTurnover)
	reused bool
}

// score predicts every candidate and prices it (Pick and PickPair share it).
func (p *Predictor) score(in *Input, cands []Candidate) scored {
	s, n := in.scratch(), len(cands)
	s.preds, s.st, s.writes, s.cost = grown(s.preds, n), grown(s.st, n), grown(s.writes, n), grown(s.cost, n)
	sc := scored{sc: s, preds: s.preds, st: s.st, cost: s.cost, writes: s.writes}
	preds, st := sc.preds, sc.st
	var fresh []int
	p.mu.RLock()
	pool := p.poolFactors()
	for i := range cands {
		var f bool
		if preds[i], f = p.predictAt(in, cands, i, &st[i], &pool); f && cands[i].Worker != nil {
			fresh = append(fresh, i)
		}
	}
	p.mu.RUnlock()
	if len(fresh) > 0 {
		// A model starts at the worker's prior; a changed profile restarts it (the old
		// factors were relative to the old prior). This changes no decision.
		p.mu.Lock()
		for _, i := range fresh {
			pr := priorFor(&p.o, &cands[i])
			if wm := p.workers[cands[i].Worker.Name]; wm == nil || wm.prior != pr {
				p.tauLeave(wm)
				p.workers[cands[i].Worker.Name] = p.newWorkerModel(pr)
				p.gen++
			}
		}
		p.mu.Unlock()
	}
	p.mu.RLock()
	util := p.utilLocked(in, cands, st, sc.writes)
	sc.pool = p.poolFactors()
	if p.o.CacheTurnover {
		sc.tau, sc.reused = p.reuse.interval(in.Keys, in.Now)
	}
	p.mu.RUnlock()
	sc.k = congestion(&p.o, util)
	for i := range sc.cost {
		sc.cost[i] = preds[i].TTFT + time.Duration(sc.k*st[i].prefill*float64(time.Second))
		if p.o.CacheTurnover {
			sc.cost[i] += time.Duration((1 + sc.k) * p.turnover(in, &cands[i], sc.writes[i], sc.tau, st[i].rate) * float64(time.Second))
		}
		sc.cost[i] += time.Duration(displacement(&p.o, st[i].adapter, st[i].theta[TermAdapter]) * float64(time.Second))
	}
	return sc
}

// Pick implements Policy: predictions for every candidate, then choose (picker.go).
func (p *Predictor) Pick(in *Input, cands []Candidate) Decision {
	sc := p.score(in, cands)
	preds, st, cost, writes, pool, k := sc.preds, sc.st, sc.cost, sc.writes, sc.pool, sc.k
	d := choose(&p.o, sc.sc, in, cands, preds, cost, st, writes)
	if p.learn && p.o.ExploreFraction > 0 && len(cands) > 1 && !d.Shed && d.Reason != ReasonDegraded && d.Reason != ReasonSLO &&
		p.o.Rand.Float64() < p.o.ExploreFraction {
		// Exploration: decide as the pool's model would (every worker at the pool's
		// factors), so a worker whose own factors shut it out is still observed. It
		// counts as exploration only where it leaves the near-ties of the own-factor cost.
		sc.sc.ex = grown(sc.sc.ex, len(cands))
		ex := sc.sc.ex
		for i := range ex {
			pp := predict(preds[i].Features, &pool)
			ex[i] = pp.TTFT + time.Duration(k*pool[TermPrefill]*preds[i].Features[TermPrefill]*float64(time.Second))
		}
		if e := choose(&p.o, sc.sc, in, cands, preds, ex, st, writes); !e.Shed && e.Index >= 0 &&
			cost[e.Index] > cost[d.Index]+max(time.Duration(float64(cost[d.Index])*p.o.TieMargin), p.o.TieMarginMin) {
			d.Index, d.Reason = e.Index, ReasonExplore
		}
	}
	p.commit(in, cands, d, &sc)
	return d
}

// commit records a decision that goes ahead (not a dry run, not shed): the chosen
// worker's writes, backlog and adapter use, the prompt's reuse, and the pick's metrics.
func (p *Predictor) commit(in *Input, cands []Candidate, d Decision, sc *scored) {
	if !in.DryRun && !d.Shed && d.Index >= 0 && cands[d.Index].Worker != nil {
		c := &cands[d.Index]
		u := float64(max(in.PromptTokens-c.CachedTokens, 0))
		p.mu.Lock()
		if wm := p.workers[c.Worker.Name]; wm != nil {
			wm.writes.add(u, in.Now, p.o.WriteHalfLife)
			wm.backlog.add(float64(max(in.PromptTokens-sc.st[d.Index].cached, 0)), c.Booked.PrefillTokens, in.Now, sc.st[d.Index].rate)
			wm.recordAdapter(in, c)
		}
		if p.o.CacheTurnover {
			p.reuse.horizon = 10 * p.o.WriteHalfLife
			p.reuse.record(in.Keys, in.Now, sc.tau, sc.reused)
		}
		p.mu.Unlock()
	}
	if l := p.o.Logger; l != nil && !in.DryRun && l.Enabled(context.Background(), slog.LevelDebug) {
		p.logDecision(l, in, cands, d)
	}
	if !in.DryRun && p.m != nil {
		if d.Shed {
			p.m.Shed.WithLabelValues(p.name).Inc()
		} else {
			p.m.PredictedTTFT.WithLabelValues(cands[d.Index].Worker.Name).Observe(d.Predictions[d.Index].TTFT.Seconds())
			p.m.Picks.WithLabelValues(p.name, d.Reason).Inc()
			if as := sc.st[d.Index].adapter; as != AdapterNone {
				p.m.AdapterPicks.WithLabelValues(as.String()).Inc()
			}
		}
	}
}

// turnover is the cache-turnover price of placing the request on c (turnoverCost):
// the worker's LRU holds its free and cached-unreferenced blocks, (1 − KVUsage) ×
// BlockCapacity blocks of in.BlockSize tokens (the whole capacity when unscraped),
// written at its decayed writes over their window, before and after this pick's
// uncached tokens. Seconds; 0 without a known capacity.
func (p *Predictor) turnover(in *Input, c *Candidate, writes, tau, rate float64) float64 {
	if c.Worker == nil || in.BlockSize <= 0 {
		return 0
	}
	capTok := float64(c.Worker.Profile.BlockCapacity) * float64(in.BlockSize)
	if !c.Load.ScrapedAt.IsZero() {
		capTok *= 1 - min(max(c.Load.KVUsage, 0), 1)
	}
	u := float64(max(in.PromptTokens-c.CachedTokens, 0))
	win := windowSeconds(p.o.WriteHalfLife)
	return turnoverCost(float64(in.PromptTokens), capTok, writes/win, (writes+u)/win, tau, rate)
}

// logDecision logs the formula's terms of the chosen worker (and the shed decision).
func (p *Predictor) logDecision(l *slog.Logger, in *Input, cands []Candidate, d Decision) {
	if d.Shed {
		l.Debug("scoring: shed", "request_id", in.RequestID, "retry_after", d.RetryAfter)
		return
	}
	c, pr := &cands[d.Index], d.Predictions[d.Index]
	l.Debug("scoring: TTFT = queue + prefill + overhead", "request_id", in.RequestID, "worker", c.Worker.Name,
		"reason", d.Reason, "ttft_s", pr.TTFT.Seconds(), "queue_s", pr.Queue.Seconds(), "prefill_s", pr.Prefill.Seconds(),
		"overhead_s", pr.Overhead.Seconds(), "prompt_tokens", in.PromptTokens, "cached_tokens", c.CachedTokens,
		"booked_prefill_tokens", c.Booked.PrefillTokens, "booked_decoding", c.Booked.Decoding, "candidates", len(cands))
}

// Coefficients is one worker's learned model in physical units (for tests and the
// admin view).
type Coefficients struct {
	Observations           int
	OverheadSeconds        float64
	PrefillTokensPerSecond float64
	Factors                [NumTerms]float64 // θ the prediction uses per term (shrunk toward the pool's, then gated), 1 = prior
	Learned                [NumTerms]float64 // θ shrunk toward the pool's, before the gate
	Own                    [NumTerms]float64 // the worker's own estimate θ_w before shrinkage
	Weights                [NumTerms]float64 // the worker's gate per term in [0, 1]: how far its own factors depart from the gated pool's (gate.go)
	PoolWeights            [NumTerms]float64 // the pool's gate per term: how much of the pool's factors enter
	ForeignRequestTokens   float64
}

// Coefficients returns worker's learned model; ok is false before its first observation.
func (p *Predictor) Coefficients(worker string) (c Coefficients, ok bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	wm := p.workers[worker]
	if wm == nil {
		return c, false
	}
	return p.coefficientsLocked(wm), true
}

// coefficientsLocked returns wm's effective (pool-shrunk) model as of its last
// observation.
func (p *Predictor) coefficientsLocked(wm *workerModel) Coefficients {
	th := p.effective(wm, wm.lastObs)
	c := Coefficients{Observations: wm.est.n, OverheadSeconds: th[TermOverhead] * wm.prior.overhead,
		PrefillTokensPerSecond: wm.prior.prefillRate / th[TermPrefill], Factors: th, Learned: p.learned(wm, wm.lastObs),
		Own: wm.est.theta, ForeignRequestTokens: wm.foreignTokens}
	c.PoolWeights = p.pool.gate.weights()
	if wm.est.n > 0 {
		c.Weights = wm.gate.weights()
	}
	return c
}

// Observe implements Learner: the first-token report (TTFT>0, E2E==0) of a request this
// policy predicted teaches the worker's factors; the completion report (E2E>0) with
// usage exports the index-vs-engine cached-tokens drift.
func (p *Predictor) Observe(o Observation) {
	p.recordLeft(o)
	if o.E2E > 0 {
		observeUsage(p.m, o)
		return
	}
	if o.TTFT <= 0 || o.Worker == "" {
		return
	}
	y := o.TTFT.Seconds()
	if p.m != nil {
		p.m.ObservedTTFT.WithLabelValues(o.Worker).Observe(y)
	}
	f := o.Predicted.Features
	if f[TermOverhead] <= 0 { // not predicted by a Predictor: nothing to regress on
		p.count(o.Worker, "skipped")
		return
	}
	if p.m != nil && o.Predicted.TTFT > 0 {
		p.m.APE.WithLabelValues(o.Worker).Observe(math.Abs(o.Predicted.TTFT.Seconds()-y) / y)
	}
	if !p.learn {
		return
	}
	if o.PromptTokens <= 0 {
		// A token-less (degraded) pick: its prefill is unknown, so the observed TTFT
		// identifies none of the terms — learning it would teach the prefill-free terms
		// (overhead, queue) the whole prefill and shut the worker out.
		p.count(o.Worker, "skipped")
		return
	}
	p.mu.Lock()
	wm := p.workers[o.Worker]
	if wm == nil { // picked before this predictor existed: assume the default prior
		wm = p.newWorkerModel(priorFor(&p.o, &Candidate{}))
		p.workers[o.Worker] = wm
		p.gen++
	}
	if u := o.PromptTokens - o.CachedTokens; u > 0 {
		wm.foreignTokens += foreignAlpha * (float64(u) - wm.foreignTokens)
	}
	at := o.Start.Add(o.TTFT)
	// Prequential scores (gate.go), made before this TTFT updates anything: the pool's
	// factors against the prior, the worker's own against the gated pool's (the two
	// levels of effective, pool.go).
	learned, pool, base := p.learned(wm, at), p.pool.est.theta, p.poolFactors()
	p.pool.gate.add(y-dot(&unitTheta, f), departures(&pool, &unitTheta, f))
	wm.gate.add(y-dot(&base, f), departures(&learned, &base, f))
	p.tauLeave(wm)
	if !o.Start.IsZero() {
		p.ageLocked(wm, at)
	}
	e, clipped := wm.est.update(f, y, p.o.Forgetting, p.o.ResidualClip, p.o.ClampFactor)
	p.pool.est.update(f, y, p.o.Forgetting, p.o.ResidualClip, p.o.ClampFactor)
	wm.s2 += s2Alpha * (e*e - wm.s2)
	p.tauJoin(wm)
	if !o.Start.IsZero() && at.After(wm.lastObs) {
		wm.lastObs = at
	}
	p.updateTau2Locked()
	c := p.coefficientsLocked(wm)
	p.mu.Unlock()
	if clipped {
		p.count(o.Worker, "clipped")
	} else {
		p.count(o.Worker, "learned")
	}
	if p.m != nil {
		p.m.Overhead.WithLabelValues(o.Worker).Set(c.OverheadSeconds)
		if c.PrefillTokensPerSecond > 0 && !math.IsInf(c.PrefillTokensPerSecond, 0) {
			p.m.PrefillRate.WithLabelValues(o.Worker).Set(c.PrefillTokensPerSecond)
		}
		for _, t := range []Term{TermQueue, TermLowerTier, TermDecode, TermAdapter} {
			p.m.Factor.WithLabelValues(o.Worker, t.String()).Set(c.Factors[t])
		}
	}
}

// recordLeft notes when one of our requests left the worker's waiting queue (first
// token) or its running set (completion), so that a scrape taken before does not count
// it as someone else's request (features: only waiting/running beyond ours is foreign),
// and counts its uncached tokens as served (utilLocked's backlog factor).
func (p *Predictor) recordLeft(o Observation) {
	if o.Worker == "" || o.Start.IsZero() {
		return
	}
	p.mu.Lock()
	if wm := p.workers[o.Worker]; wm != nil {
		u := float64(max(o.PromptTokens-o.CachedTokens, 0)) // what the pick wrote (Pick: writes)
		if o.E2E > 0 {
			wm.finished.add(o.Start.Add(o.E2E))
			if o.TTFT > 0 && o.E2E > o.TTFT {
				d := (o.E2E - o.TTFT).Seconds()
				if wm.decode <= 0 {
					wm.decode = d
				} else {
					wm.decode += decodeAlpha * (d - wm.decode)
				}
			}
			if o.TTFT <= 0 { // not streamed: reported once, at completion
				wm.served.add(u, o.Start.Add(o.E2E), p.o.WriteHalfLife)
			}
		} else if o.TTFT > 0 {
			wm.firstTokens.add(o.Start.Add(o.TTFT))
			if wm.firstDecode.IsZero() {
				wm.firstDecode = o.Start.Add(o.TTFT)
			}
			wm.served.add(u, o.Start.Add(o.TTFT), p.o.WriteHalfLife)
			wm.backlog.pop()
		}
	}
	p.mu.Unlock()
}

func (p *Predictor) count(worker, result string) {
	if p.m != nil {
		p.m.Observations.WithLabelValues(worker, result).Inc()
	}
}

// observeUsage exports the drift between the index's predicted cached tokens and the
// engine's usage.prompt_tokens_details.cached_tokens. vLLM omits cached_tokens when it
// is zero (and without --enable-prompt-tokens-details): an absent or null count is no
// evidence and is not compared; an explicit number is, 0 included (an explicit 0
// against a prediction of N > 0 is index_over).
func observeUsage(m *metrics.Scoring, o Observation) {
	if m == nil || !o.Usage.CachedReported {
		return
	}
	d := o.Usage.CachedTokens - o.CachedTokens
	m.CachedTokensError.Observe(math.Abs(float64(d)))
	switch {
	case d < 0:
		m.CachedTokensMismatch.WithLabelValues("index_over").Inc()
	case d > 0:
		m.CachedTokensMismatch.WithLabelValues("index_under").Inc()
	}
}

// WorkerAdded implements workers.Listener (nothing to do: a model starts at first pick).
func (p *Predictor) WorkerAdded(*workers.Worker) {}

// WorkerRemoved implements workers.Listener: the worker's model and its metric series
// are dropped (a worker re-added under the same name starts again from its prior).
func (p *Predictor) WorkerRemoved(w *workers.Worker) {
	p.mu.Lock()
	p.tauLeave(p.workers[w.Name])
	delete(p.workers, w.Name)
	p.gen++
	p.mu.Unlock()
	if m := p.m; m != nil {
		for _, v := range []interface{ DeleteLabelValues(...string) bool }{m.PrefillRate, m.Overhead, m.PredictedTTFT, m.ObservedTTFT, m.APE} {
			v.DeleteLabelValues(w.Name)
		}
		for _, t := range []Term{TermQueue, TermLowerTier, TermDecode, TermAdapter} {
			m.Factor.DeleteLabelValues(w.Name, t.String())
		}
		for _, r := range []string{"learned", "clipped", "skipped"} {
			m.Observations.DeleteLabelValues(w.Name, r)
		}
	}
}
