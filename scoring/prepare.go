package scoring

// Preparer is implemented by policies that can do their per-candidate work before the
// router takes its lock. The router calls Prepare without its lock (concurrently with
// other Prepares, Picks and Observes), with each candidate's Booked as last published
// (it may be stale by the bookings of concurrent picks); then Pick under its lock with
// the same in and the current Booked. Pick must decide exactly as without Prepare: it
// reuses only what was computed from inputs that have not changed since, and
// recomputes the rest (Predictor: the prediction of every candidate whose Booked
// changed, typically a few of 64 under 16 concurrent streams).
type Preparer interface {
	Prepare(in *Input, cands []Candidate)
}

// prepared is Prepare's result, carried on the Input to the Pick that follows.
type prepared struct {
	preds  []Prediction
	st     []candState // each prediction's by-products (cached after evictions, prefill seconds, rate, factors)
	fresh  []bool
	booked []Booked // each prediction's Booked
	names  []string // each prediction's worker (cands is the same list in Pick)
	// wms is each candidate's worker model (Predictor.model) as of the workers map's
	// generation gen: valid for the Pick while the map has not changed since.
	wms []*workerModel
	gen uint64
}

// models returns pr's worker models for cands when they are still the map's (its
// generation is gen and cands are the candidates Prepare saw), else nil. pr may be nil.
func (pr *prepared) models(gen uint64, cands []Candidate) []*workerModel {
	if pr == nil || pr.gen != gen || len(pr.wms) != len(cands) {
		return nil
	}
	for i := range cands {
		if c := &cands[i]; c.Worker == nil && pr.names[i] != "" || c.Worker != nil && pr.names[i] != c.Worker.Name {
			return nil
		}
	}
	return pr.wms
}

// Prepare implements Preparer: one prediction per candidate with the worker's current
// factors and the candidate's Booked as given.
func (p *Predictor) Prepare(in *Input, cands []Candidate) {
	pr, n := &in.scratch().prep, len(cands)
	pr.preds, pr.st, pr.fresh = grown(pr.preds, n), grown(pr.st, n), grown(pr.fresh, n)
	pr.booked, pr.names, pr.wms = grown(pr.booked, n), grown(pr.names, n), grown(pr.wms, n)
	p.mu.RLock()
	pool := p.poolFactors()
	pr.gen = p.gen
	for i := range cands {
		pr.wms[i] = p.model(&cands[i])
		pr.preds[i], pr.fresh[i] = p.predictWith(in, &cands[i], pr.wms[i], &pr.st[i], &pool)
		pr.booked[i] = cands[i].Booked
		pr.names[i] = ""
		if cands[i].Worker != nil {
			pr.names[i] = cands[i].Worker.Name
		}
	}
	p.mu.RUnlock()
	in.prepared = pr
}

// predictAt is predictLocked for cands[i], reusing Prepare's prediction when the
// candidate is the one it was made for with the same Booked (everything else a
// prediction reads — cached prefix, scraped load, request — is fixed for the pick; the
// backlog a pick adds goes to the worker it books, whose Booked then differs). Factors
// learned from an observation between Prepare and Pick are not reflected: the reused
// prediction is at most that observation old. st receives the by-products; pool is
// p.poolFactors(). Caller holds p.mu for reading.
func (p *Predictor) predictAt(in *Input, cands []Candidate, i int, st *candState, pool *[NumTerms]float64) (Prediction, bool) {
	c := &cands[i]
	if pr := in.prepared; pr != nil && i < len(pr.preds) && pr.booked[i] == c.Booked &&
		(c.Worker == nil && pr.names[i] == "" || c.Worker != nil && pr.names[i] == c.Worker.Name) {
		if !pr.fresh[i] {
			*st = pr.st[i]
			return pr.preds[i], false
		}
	}
	return p.predictLocked(in, c, st, pool)
}
