package scoring

import (
	"context"
	"log/slog"
	"math"
	"sync"

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
}

// workerModel is what the predictor knows about one worker.
type workerModel struct {
	prior         prior   // the prior the factors are relative to; a changed profile resets them
	est           *rls    // factors θ
	foreignTokens float64 // EWMA of uncached prompt tokens of requests routed here
	writes        decayed // uncached prompt tokens routed here, decayed by WriteHalfLife
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
	return &Predictor{name: name, o: o, learn: learn, m: o.Metrics, workers: map[string]*workerModel{}}
}

// Name implements Policy.
func (p *Predictor) Name() string { return p.name }

// Predict returns the prediction for one candidate with the worker's current factors.
func (p *Predictor) Predict(in *Input, c *Candidate) Prediction {
	p.mu.RLock()
	defer p.mu.RUnlock()
	pred, _ := p.predictLocked(in, c)
	return pred
}

// predictLocked predicts with the worker's factors; fresh reports that the worker has
// no model for its current prior yet (first sight, or its profile changed).
func (p *Predictor) predictLocked(in *Input, c *Candidate) (_ Prediction, fresh bool) {
	pr := priorFor(&p.o, c)
	theta, foreign := &unitTheta, float64(p.o.ForeignRequestTokens)
	fresh = true
	if c.Worker != nil {
		if wm := p.workers[c.Worker.Name]; wm != nil && wm.prior == pr {
			theta, foreign, fresh = &wm.est.theta, wm.foreignTokens, false
		}
	}
	return predict(features(&p.o, in, c, pr, foreign), theta), fresh
}

// Pick implements Policy: predictions for every candidate, then choose (picker.go).
func (p *Predictor) Pick(in *Input, cands []Candidate) Decision {
	preds := make([]Prediction, len(cands))
	var fresh []int
	p.mu.RLock()
	for i := range cands {
		var f bool
		if preds[i], f = p.predictAt(in, cands, i); f && cands[i].Worker != nil {
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
				p.workers[cands[i].Worker.Name] = &workerModel{prior: pr, est: newRLS(), foreignTokens: float64(p.o.ForeignRequestTokens)}
			}
		}
		p.mu.Unlock()
	}
	writes := make([]float64, len(cands))
	p.mu.RLock()
	for i := range cands {
		if c := &cands[i]; c.Worker != nil {
			if wm := p.workers[c.Worker.Name]; wm != nil {
				writes[i] = wm.writes.at(in.Now, p.o.WriteHalfLife)
			}
		}
	}
	p.mu.RUnlock()
	d := choose(&p.o, in, cands, preds, writes)
	if !in.DryRun && !d.Shed && d.Index >= 0 && cands[d.Index].Worker != nil {
		u := float64(max(in.PromptTokens-cands[d.Index].CachedTokens, 0))
		p.mu.Lock()
		if wm := p.workers[cands[d.Index].Worker.Name]; wm != nil {
			wm.writes.add(u, in.Now, p.o.WriteHalfLife)
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
			p.m.PredictedTTFT.WithLabelValues(cands[d.Index].Worker.Name).Observe(preds[d.Index].TTFT.Seconds())
			p.m.Picks.WithLabelValues(p.name, d.Reason).Inc()
		}
	}
	return d
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
	Factors                [NumTerms]float64 // θ per term, 1 = prior
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
	return wm.coefficients(), true
}

func (wm *workerModel) coefficients() Coefficients {
	th := wm.est.theta
	return Coefficients{Observations: wm.est.n, OverheadSeconds: th[TermOverhead] * wm.prior.overhead,
		PrefillTokensPerSecond: wm.prior.prefillRate / th[TermPrefill], Factors: th, ForeignRequestTokens: wm.foreignTokens}
}

// Observe implements Learner: the first-token report (TTFT>0, E2E==0) of a request this
// policy predicted teaches the worker's factors; the completion report (E2E>0) with
// usage exports the index-vs-engine cached-tokens drift.
func (p *Predictor) Observe(o Observation) {
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
	p.mu.Lock()
	wm := p.workers[o.Worker]
	if wm == nil { // picked before this predictor existed: assume the default prior
		wm = &workerModel{prior: priorFor(&p.o, &Candidate{}), est: newRLS(), foreignTokens: float64(p.o.ForeignRequestTokens)}
		p.workers[o.Worker] = wm
	}
	if u := o.PromptTokens - o.CachedTokens; u > 0 {
		wm.foreignTokens += foreignAlpha * (float64(u) - wm.foreignTokens)
	}
	clipped := wm.est.update(f, y, p.o.Forgetting, p.o.ResidualClip, p.o.ClampFactor)
	c := wm.coefficients()
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
		for _, t := range []Term{TermQueue, TermLowerTier, TermDecode} {
			p.m.Factor.WithLabelValues(o.Worker, t.String()).Set(c.Factors[t])
		}
	}
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
	delete(p.workers, w.Name)
	p.mu.Unlock()
	if m := p.m; m != nil {
		for _, v := range []interface{ DeleteLabelValues(...string) bool }{m.PrefillRate, m.Overhead, m.PredictedTTFT, m.ObservedTTFT, m.APE} {
			v.DeleteLabelValues(w.Name)
		}
		for _, t := range []Term{TermQueue, TermLowerTier, TermDecode} {
			m.Factor.DeleteLabelValues(w.Name, t.String())
		}
		for _, r := range []string{"learned", "clipped", "skipped"} {
			m.Observations.DeleteLabelValues(w.Name, r)
		}
	}
}
