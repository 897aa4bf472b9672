package kvindex

import "time"

// FailingAfter is how many BlockStored events in a row, with none applied in between,
// must fail to apply (unknown parent, or fields that disagree) before a worker counts
// as failing: its mode is approximate, not exact, until one applies again. One such
// event is routine (a publisher that started before kvroute names parents sent
// earlier); 16 in a row is a publisher whose events the index cannot use at all, e.g.
// one that writes a parent hash for "no parent" that the decoder does not read as such.
const FailingAfter = 16

// DocsNoEvents is the documentation section that explains a silent or failing worker,
// named in the log lines that report one.
const DocsNoEvents = "docs/kv-events.md#when-events-do-not-arrive"

// failNote collects, during one batch, what happened to its BlockStored events.
type failNote struct {
	reason string // anomaly class of the last failed event
	n      int    // events that failed in this batch
}

func (f *failNote) failed(w *worker, reason string) {
	w.failRun++
	f.n++
	f.reason = reason
}

func (f *failNote) applied(w *worker) { w.failRun = 0 }

// settle updates w.failing after a batch and reports whether the failure must be
// logged now (the first time the worker fails, once per worker).
func (f *failNote) settle(w *worker) bool {
	switch {
	case w.failRun >= FailingAfter:
		w.failing = true
		if !w.failLogged {
			w.failLogged = true
			return true
		}
	case w.failRun == 0:
		w.failing = false
	}
	return false
}

// logFailing says once why a worker is not exact although its events arrive.
func (ix *Index) logFailing(name string, f failNote) {
	why := "its BlockStored events disagree with themselves (token ids vs block hashes, block size)"
	if f.reason == "unknown_parent" {
		why = "its BlockStored events name parent blocks the index never saw stored; a publisher that writes a " +
			"parent hash for \"no parent\" other than nil or 0, or one whose events are keyed by another hash than its earlier ones"
	}
	ix.log.Warn("kvindex: worker's KV events keep failing to apply; worker runs approximate (speculative entries only) until one applies",
		"worker", name, "failed_in_a_row", FailingAfter, "anomaly", f.reason, "why", why, "docs", DocsNoEvents)
}

// noteTraffic records a booking for a worker when speculative entries are off (book
// returns before locking the worker then).
func (ix *Index) noteTraffic(name string) {
	if w := ix.worker(name); w != nil {
		w.mu.Lock()
		ix.trafficLocked(w)
		w.mu.Unlock()
	}
}

// trafficLocked starts w's silence clock at its first booking after its last event.
func (ix *Index) trafficLocked(w *worker) {
	if w.trafficSince.IsZero() {
		w.trafficSince = ix.opt.Now()
	}
}

// Silent reports how long a worker that expects KV events has taken traffic (been
// booked by the router) without one event batch arriving: the time since its first
// booking after its last batch (or after it was added). ok is false for an unknown
// worker, one that expects no events, or one not booked since its last batch.
func (ix *Index) Silent(name string) (d time.Duration, ok bool) {
	w := ix.worker(name)
	if w == nil {
		return 0, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.info.Events || w.trafficSince.IsZero() {
		return 0, false
	}
	return ix.opt.Now().Sub(w.trafficSince), true
}

// LastEvent returns when a batch of worker's KV events was last applied; ok is false
// when none was (or the worker is unknown).
func (ix *Index) LastEvent(name string) (t time.Time, ok bool) {
	w := ix.worker(name)
	if w == nil {
		return time.Time{}, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastEvent, !w.lastEvent.IsZero()
}
