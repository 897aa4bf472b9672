package router

import (
	"container/heap"
	"math"
	"sync"
	"time"

	"github.com/kvroute/kvroute/scoring"
)

// SLO refusal calibration. A request refused on its prediction (PickOptions
// RefuseOnSLOMiss) is refused when the best worker's predicted TTFT, times a margin m,
// is past its objective. The predictor's error grows with load (queues it sees only
// through a scrape, prefill chunks interleaving with decodes), so m is learned from
// every request picked with an objective: m tracks a quantile of observed ÷ predicted
// TTFT by stochastic approximation (Robbins & Monro, 1951):
//
//	m ← clamp(m · exp(η · (1[TTFT > m · predicted] − (1 − q))), mMin, mMax)
//
// whose fixed point is the q-quantile of the ratio. Every request informs it, not only
// those near the objective, so it neither drifts down while the fleet is quiet nor
// lags a rising load by much. Two quantiles are kept: the 90th, the margin of every
// class, and the median, the margin of a class no other class outranks while lower
// classes exist (it is refused only when it is more likely to miss than to meet:
// refusing it costs its attainment for sure, and what its admission costs falls on
// lower classes, whose threshold the pressure below tightens).
//
// A miss is known at the deadline (admission + objective) when no first token has come
// by then, so a streamed request is counted then, not when its late first token
// arrives (its ratio is then known to be past objective ÷ predicted). A non-streamed
// request counts only when it completes within its objective (its TTFT is at most its
// E2E).
//
// Priority. Each class keeps a pressure p by the same update over all of its requests,
// with a refused one counted as a miss: p rises while the class meets its objective
// less often than its attainment asks. A class's threshold is divided by the largest
// pressure of the classes of higher priority, so lower classes are refused first and
// the capacity they would have queued serves the higher class; p returns to 1 once the
// higher class meets its attainment again.
//
// Its own admitted requests. The margin is a quantile over every request, but those
// admitted near the threshold are the ones whose ratio matters, and at load their
// ratios run past the overall quantile: the admitted could then miss more often than
// the attainment allows. So each class also keeps a correction s ≥ 1 by the same update
// over its admitted requests with a prediction only (a refusal does not count: it would tighten the
// threshold further the more it refuses), and its threshold is divided by s too: s
// rises while more than 1 − attainment of the admitted miss, and returns to 1 when
// fewer do, so an admitted p90 (attainment 0.9) settles at the objective and a fleet
// meeting it refuses no more than the margin does. Not for a class no other outranks
// while lower classes exist (refused at the median above).
const (
	sloMarginStep  = 0.05 // η
	sloMarginMin   = 0.5
	sloMarginMax   = 8.0
	sloPressureMax = 16.0
	// DefaultSLOAttainment is the share of a class's requests that should meet its
	// objective when the class does not say (config admission.classes[].slo_attainment).
	DefaultSLOAttainment = 0.9
	sloMaxClasses        = 256 // class names come from the config; past this many they share ""
	// A ticket waits on the deadline heap (held there after it ends) only when its
	// objective is within sloDueHorizon, and only while the heap holds fewer than
	// sloMaxDue tickets: a client's x-slo-ttft-ms (up to 10⁹ ms) must not make the
	// router keep every ticket for days. Others still count at their first token.
	sloDueHorizon = 5 * time.Minute
	sloMaxDue     = 1 << 16
)

// step is one Robbins–Monro step of v towards the level at which a share alpha of the
// indicators miss are 1, kept within [lo, hi].
func step(v, miss, alpha, lo, hi float64) float64 {
	return min(max(v*math.Exp(sloMarginStep*(miss-alpha)), lo), hi)
}

// ratioQuantile tracks the q-quantile of observed ÷ predicted TTFT.
type ratioQuantile struct {
	q, m float64
}

// fold moves the estimate by one request whose ratio is known to lie in [lo, hi]; a
// ratio on both sides of the estimate tells nothing and is skipped.
func (r *ratioQuantile) fold(lo, hi float64) {
	switch {
	case lo > r.m:
		r.m = step(r.m, 1, 1-r.q, sloMarginMin, sloMarginMax)
	case hi <= r.m:
		r.m = step(r.m, 0, 1-r.q, sloMarginMin, sloMarginMax)
	}
}

type sloClass struct {
	prio  int
	alpha float64 // 1 − attainment
	p     float64 // pressure on lower classes
	self  float64 // correction of its own threshold from its admitted requests' misses
}

// sloMargins holds the margins, the per-class pressures and the deadlines of picked
// streamed requests not yet counted.
type sloMargins struct {
	mu      sync.Mutex
	init    bool
	p90     ratioQuantile
	p50     ratioQuantile
	classes map[string]*sloClass
	due     deadlines
}

func (s *sloMargins) initLocked() {
	if !s.init {
		s.init, s.p90, s.p50 = true, ratioQuantile{q: 0.9, m: 1}, ratioQuantile{q: 0.5, m: 1}
	}
}

// classLocked returns class cp's state, created on first use.
func (s *sloMargins) classLocked(cp ClassPolicy) *sloClass {
	s.initLocked()
	name := cp.Class
	c := s.classes[name]
	if c == nil {
		if s.classes == nil {
			s.classes = map[string]*sloClass{}
		}
		if len(s.classes) >= sloMaxClasses {
			name = ""
			c = s.classes[name]
		}
		if c == nil {
			c = &sloClass{p: 1, self: 1}
			s.classes[name] = c
		}
	}
	att := cp.Attainment
	if att <= 0 || att >= 1 {
		att = DefaultSLOAttainment
	}
	c.prio, c.alpha = cp.Priority, 1-att
	return c
}

// threshold returns the predicted TTFT past which a request of cp is refused, with
// the margin (the 90th percentile), cp's own pressure and cp's own correction it read,
// and counts the misses whose deadline has passed by now.
func (s *sloMargins) threshold(cp ClassPolicy, now time.Time) (limit time.Duration, margin, pressure, correction float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(now)
	c := s.classLocked(cp)
	p, top, lower := 1.0, true, false
	for _, o := range s.classes {
		switch {
		case o.prio > c.prio:
			p, top = max(p, o.p), false
		case o.prio < c.prio:
			lower = true
		}
	}
	m, corr := s.p90.m*c.self, c.self
	if top && lower {
		m, corr = s.p50.m, 1
	}
	return time.Duration(float64(cp.SLO) / (m * p)), s.p90.m, c.p, corr
}

// admitted registers t, picked with an objective, for its outcome: a streamed one is
// counted as a miss at its deadline unless its first token came by then.
func (s *sloMargins) admitted(t *Ticket, stream bool, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	s.expireLocked(now)
	if stream && t.slo.SLO <= sloDueHorizon && len(s.due) < sloMaxDue {
		heap.Push(&s.due, t)
	}
}

// refused counts a refusal of class cp against its pressure.
func (s *sloMargins) refused(cp ClassPolicy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.classLocked(cp)
	c.p = step(c.p, 1, c.alpha, 1, sloPressureMax)
}

// observe folds in one picked request's TTFT, once per ticket.
func (s *sloMargins) observe(t *Ticket, ttft time.Duration) {
	if !t.sloCounted.CompareAndSwap(false, true) {
		return
	}
	r := ratio(ttft, t.sloPred)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.foldLocked(t, ttft > t.slo.SLO, r, r)
}

// met folds in a non-streamed request that completed at e2e, within its objective:
// its TTFT, unknown, was at most e2e.
func (s *sloMargins) met(t *Ticket, e2e time.Duration) {
	if !t.sloCounted.CompareAndSwap(false, true) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.foldLocked(t, false, 0, ratio(e2e, t.sloPred))
}

// ratio is observed ÷ predicted; NaN without a prediction.
func ratio(obs, pred time.Duration) float64 {
	if pred <= 0 {
		return math.NaN()
	}
	return float64(obs) / float64(pred)
}

// foldLocked moves t's class pressure by whether it missed its objective and the
// margins by its ratio, known to lie in [lo, hi] (NaN: no prediction, margins kept).
func (s *sloMargins) foldLocked(t *Ticket, sloMiss bool, lo, hi float64) {
	c := s.classLocked(t.slo)
	x := 0.0
	if sloMiss {
		x = 1
	}
	c.p = step(c.p, x, c.alpha, 1, sloPressureMax)
	if !math.IsNaN(lo) && !math.IsNaN(hi) {
		c.self = step(c.self, x, c.alpha, 1, sloPressureMax)
		s.p90.fold(lo, hi)
		s.p50.fold(lo, hi)
	}
}

// expireLocked counts as a miss every registered ticket whose deadline is at or
// before now without a first token: its ratio is past objective ÷ predicted.
func (s *sloMargins) expireLocked(now time.Time) {
	for len(s.due) > 0 && !s.due[0].sloDeadline().After(now) {
		t := heap.Pop(&s.due).(*Ticket)
		if t.sloCounted.CompareAndSwap(false, true) {
			s.foldLocked(t, true, ratio(t.slo.SLO, t.sloPred), math.Inf(1))
		}
	}
}

// margins returns the two margins and class name's pressure (1, 1, 1 before any
// feedback).
func (s *sloMargins) margins(name string) (p90, p50, pressure float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	pressure = 1
	if c := s.classes[name]; c != nil {
		pressure = c.p
	}
	return s.p90.m, s.p50.m, pressure
}

// deadlines is a min-heap of tickets by their SLO deadline.
type deadlines []*Ticket

func (d deadlines) Len() int           { return len(d) }
func (d deadlines) Less(i, j int) bool { return d[i].sloDeadline().Before(d[j].sloDeadline()) }
func (d deadlines) Swap(i, j int)      { d[i], d[j] = d[j], d[i] }
func (d *deadlines) Push(x any)        { *d = append(*d, x.(*Ticket)) }
func (d *deadlines) Pop() any {
	old := *d
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*d = old[:len(old)-1]
	return t
}

func (t *Ticket) sloDeadline() time.Time { return t.Start.Add(t.slo.SLO) }

// SLOMargins returns the refusal rule's calibration now: the margin applied to
// predictions (the 90th percentile of observed ÷ predicted TTFT; 1 = the predictor as
// is, 1.5 = a request is refused when 1.5 × its best prediction is past its
// objective), the median margin of the top-priority class, and class's pressure on
// the classes of lower priority (1 = none; "" is the class of requests with an
// objective and no class).
func (r *Router) SLOMargins(class string) (margin, topMargin, pressure float64) {
	return r.sloMargin.margins(class)
}

// observeScaling sets the autoscaling gauges from a decision: the best predicted TTFT
// of a pick with tokens (refused or not) and, under the refusal rule, the margin and
// the class's pressure.
func (r *Router) observeScaling(in *input, d scoring.Decision) {
	if in.Degraded == "" && in.PromptTokens > 0 && len(d.Predictions) > 0 {
		best := d.Predictions[0].TTFT
		for _, p := range d.Predictions[1:] {
			best = min(best, p.TTFT)
		}
		r.m.BestTTFT.WithLabelValues(in.Model).Set(best.Seconds())
	}
	if in.RefuseAbove > 0 {
		r.m.SLOMargin.Set(in.sloMargin)
		r.m.SLOPressure.WithLabelValues(in.cls.Class).Set(in.sloPressure)
		r.m.SLOCorrection.WithLabelValues(in.cls.Class).Set(in.sloCorrection)
	}
}
