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
}

// Prepare implements Preparer: one prediction per candidate with the worker's current
// factors and the candidate's Booked as given.
func (p *Predictor) Prepare(in *Input, cands []Candidate) {
	pr, n := &in.scratch().prep, len(cands)
	pr.preds, pr.st, pr.fresh = grown(pr.preds, n), grown(pr.st, n), grown(pr.fresh, n)
	pr.booked, pr.names = grown(pr.booked, n), grown(pr.names, n)
	p.mu.RLock()
	for i := range cands {
		pr.preds[i], pr.fresh[i] = p.predictLocked(in, &cands[i], &pr.st[i])
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
// prediction is at most that observation old. st receives the by-products. Caller holds
// p.mu for reading.
func (p *Predictor) predictAt(in *Input, cands []Candidate, i int, st *candState) (Prediction, bool) {
	c := &cands[i]
	if pr := in.prepared; pr != nil && i < len(pr.preds) && pr.booked[i] == c.Booked &&
		(c.Worker == nil && pr.names[i] == "" || c.Worker != nil && pr.names[i] == c.Worker.Name) {
		if !pr.fresh[i] {
			*st = pr.st[i]
			return pr.preds[i], false
		}
	}
	return p.predictLocked(in, c, st)
}
