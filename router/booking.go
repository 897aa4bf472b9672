package router

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
)

// flight is one worker's bookings. booked is guarded by Router.mu; pub is booked as
// last published (atomics: a lock-free snapshot for Prepare, possibly stale or torn,
// which Pick corrects under mu).
type flight struct {
	booked             scoring.Booked
	left               leftEvents // when this replica's requests here left the queue / finished
	pub                [5]atomic.Int64
	inFlight, inTokens prometheus.Gauge
}

func (f *flight) snapshot() scoring.Booked {
	return scoring.Booked{Requests: int(f.pub[0].Load()), PrefillTokens: int(f.pub[1].Load()),
		Prefilling: int(f.pub[2].Load()), Decoding: int(f.pub[3].Load()), KVTokens: int(f.pub[4].Load())}
}

// flightLocked returns worker's in-flight state, created (with its gauges) on first
// use. Caller holds r.mu.
func (r *Router) flightLocked(worker string) *flight {
	f := r.flights[worker]
	if f == nil {
		f = &flight{inFlight: r.m.InFlight.WithLabelValues(worker), inTokens: r.m.InFlightTokens.WithLabelValues(worker)}
		r.flights[worker] = f
		r.pub.Store(worker, f)
	}
	return f
}

// bookLocked adds (sign 1) or removes (sign -1) t's share of f's bookings as t stands
// now: a request prefilling its uncached tokens before the first token, decoding after.
// Caller holds r.mu; f belongs to t.on.
func (t *Ticket) bookLocked(f *flight, sign int) {
	f.booked.Requests += sign
	f.booked.KVTokens += sign * t.kvTokens
	if t.firstAt.IsZero() {
		f.booked.Prefilling += sign
		f.booked.PrefillTokens += sign * t.prefill
		if t.PromptTokens <= 0 {
			f.booked.Unsized += sign
		}
	} else {
		f.booked.Decoding += sign
	}
	t.r.gaugesLocked(t.on, f)
}

// gaugesLocked publishes f's bookings (gauges and the lock-free snapshot) after a
// change. Caller holds r.mu.
func (r *Router) gaugesLocked(_ string, f *flight) {
	b := &f.booked
	r.noteChange()
	f.pub[0].Store(int64(b.Requests))
	f.pub[1].Store(int64(b.PrefillTokens))
	f.pub[2].Store(int64(b.Prefilling))
	f.pub[3].Store(int64(b.Decoding))
	f.pub[4].Store(int64(b.KVTokens))
	f.inFlight.Set(float64(b.Requests))
	f.inTokens.Set(float64(b.PrefillTokens))
}

// book adds t's speculative index entries, outside r.mu (O(prompt blocks)). A ticket
// already released (its worker removed meanwhile) books nothing: specMu makes the
// removal's index cleanup wait for a booking in progress.
func (r *Router) book(t *Ticket, keys []kvindex.Key) {
	if r.opt.Index == nil || len(keys) == 0 {
		return
	}
	r.specMu.RLock()
	defer r.specMu.RUnlock()
	if t.released.Load() {
		return
	}
	b := r.opt.Index.Book(t.Worker, keys)
	if b.Len() > 0 {
		t.spec.Store(&b)
		r.noteChange() // the keys being prefilled changed (LocalBookings)
	}
	r.bookPrefillSpecLocked(t, keys)
}

// bookPrefillSpec adds t's speculative index entries on its prefill worker (a retried
// prefill leg's new one), outside r.mu.
func (r *Router) bookPrefillSpec(t *Ticket, keys []kvindex.Key) {
	if r.opt.Index == nil || len(keys) == 0 {
		return
	}
	r.specMu.RLock()
	defer r.specMu.RUnlock()
	if !t.released.Load() {
		r.bookPrefillSpecLocked(t, keys)
	}
}

// bookPrefillSpecLocked books keys on t's prefill worker, which computes them too (and
// keeps them cached). Caller holds r.specMu for reading.
func (r *Router) bookPrefillSpecLocked(t *Ticket, keys []kvindex.Key) {
	if t.PrefillWorker != "" {
		if pb := r.opt.Index.Book(t.PrefillWorker, keys); pb.Len() > 0 {
			t.pfSpec.Store(&pb)
		}
	}
}

// withdraw removes t's speculative index entries (the request failed before the worker
// computed its blocks).
func (r *Router) withdraw(t *Ticket) {
	if b := t.spec.Swap(nil); b != nil && r.opt.Index != nil {
		r.m.SpecWithdrawn.Add(float64(r.opt.Index.Withdraw(*b)))
	}
	r.withdrawPrefill(t)
}

// withdrawPrefill removes t's speculative index entries on its prefill worker.
func (r *Router) withdrawPrefill(t *Ticket) {
	if b := t.pfSpec.Swap(nil); b != nil && r.opt.Index != nil {
		r.m.SpecWithdrawn.Add(float64(r.opt.Index.Withdraw(*b)))
	}
}
