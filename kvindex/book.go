package kvindex

// Booking is what one Book call added to the index: the keys whose speculative holder
// it created on one worker, and the stamp it gave them. The zero Booking holds nothing.
type Booking struct {
	worker *worker
	stamp  uint32
	keys   []Key
}

// Len is the number of speculative entries the booking created.
func (b Booking) Len() int { return len(b.keys) }

// Book is Speculate, returning what it added so that Withdraw can take it back when
// the request fails before the worker computed those blocks (it rejected the request,
// or the client went away first). Cost as Speculate, plus 8 bytes per created entry.
func (ix *Index) Book(name string, keys []Key) Booking { return ix.book(name, keys, true) }

// Withdraw removes the speculative entries b created that are still as b left them:
// an entry confirmed by a KV event since, or booked again by a later Book or Speculate
// (a newer stamp: another request relies on it), stays. A later booking within the
// same millisecond of the same keys on the same worker shares b's stamp and is
// withdrawn with it (the entry returns with the worker's KV events or its next
// booking). It returns how many entries it removed; the worker's FIFO drops their
// entries as it reaches them. Safe to call more than once (later calls remove nothing).
func (ix *Index) Withdraw(b Booking) int {
	w := b.worker
	if w == nil || len(b.keys) == 0 {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.removed {
		return 0
	}
	n := 0
	for _, k := range b.keys {
		_, after, existed := ix.update(k, w.id, nil, func(h *holder) bool { return !(h.spec() && h.stamp == b.stamp) })
		if existed && after.wf == 0 {
			n++
		}
	}
	w.specLive -= n
	if n > 0 {
		w.met.entries.Set(float64(w.nEng + w.specLive))
		ix.updateGauges()
	}
	return n
}

// Keys returns the keys whose speculative entry the booking created (shared, not to
// be modified): the blocks a request is about to prefill on the booking's worker that
// no earlier event or booking announced there.
func (b Booking) Keys() []Key { return b.keys }
