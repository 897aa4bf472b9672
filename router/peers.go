package router

import (
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
)

// WorkerBookings is this replica's in-flight state on one worker, as sent to peer
// replicas (package peers).
type WorkerBookings struct {
	Worker string
	Booked scoring.Booked
	// OldestPrefill is the start of the oldest booked request still prefilling (no
	// first token yet); zero when none is.
	OldestPrefill time.Time
	// Keys are block keys being prefilled: the speculative index entries created by
	// this replica's prefilling requests on Worker, deduplicated, at most the maxKeys
	// given to LocalBookings.
	Keys []kvindex.Key
}

// SetPeerBookings replaces the bookings peer replicas hold, per worker name (summed
// over peers); nil clears them. Every pick adds them to the candidate's own bookings
// (Candidate.Booked). m must not be modified afterwards. Lock-free (an atomic store).
func (r *Router) SetPeerBookings(m map[string]scoring.Booked) {
	if len(m) == 0 {
		r.peerBooked.Store(nil)
	} else {
		r.peerBooked.Store(&m)
	}
	r.capacityFreed() // a peer's booking may have ended: a waiting request may now fit
}

// PeerBookings returns what SetPeerBookings last stored (nil none); not to be modified.
func (r *Router) PeerBookings() map[string]scoring.Booked {
	if p := r.peerBooked.Load(); p != nil {
		return *p
	}
	return nil
}

// Changes returns a counter that grows at every change of this replica's bookings
// (a pick, a first token, an end, a speculative booking): a sender of LocalBookings
// compares it to the value it last sent to know whether anything changed.
func (r *Router) Changes() uint64 { return r.changes.Load() }

// ChangeSignal returns a channel that receives (at most one pending value) after a
// change counted by Changes: a sender waits on it instead of polling. Nil for a Router
// not made by New (a receive then blocks for ever).
func (r *Router) ChangeSignal() <-chan struct{} { return r.changed }

// noteChange counts a change of this replica's bookings and signals ChangeSignal
// without blocking.
func (r *Router) noteChange() {
	r.changes.Add(1)
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// LocalBookings returns this replica's own bookings per worker with open requests,
// in no particular order, with at most maxKeys block
// keys per worker (0: none). Under r.mu it copies O(workers + open tickets) values;
// the keys are read after.
func (r *Router) LocalBookings(maxKeys int) []WorkerBookings {
	type pending struct {
		t   *Ticket
		out int
	}
	r.mu.Lock()
	out := make([]WorkerBookings, 0, len(r.flights))
	at := make(map[string]int, len(r.flights))
	for name, f := range r.flights {
		if f.booked.Requests <= 0 {
			continue
		}
		at[name] = len(out)
		out = append(out, WorkerBookings{Worker: name, Booked: f.booked})
	}
	var pre []pending
	for _, t := range r.tickets {
		if !t.firstAt.IsZero() {
			continue
		}
		i, ok := at[t.Worker]
		if !ok {
			continue
		}
		if o := &out[i]; o.OldestPrefill.IsZero() || t.Start.Before(o.OldestPrefill) {
			o.OldestPrefill = t.Start
		}
		pre = append(pre, pending{t, i})
	}
	r.mu.Unlock()
	if maxKeys <= 0 {
		return out
	}
	// Keys are deduplicated per worker: the same prefix prefilling on two workers at
	// once (a burst spread before either finished) is reported for both.
	seen := make([]map[kvindex.Key]struct{}, len(out))
	for _, p := range pre {
		b := p.t.spec.Load()
		if b == nil || p.t.released.Load() {
			continue
		}
		o := &out[p.out]
		if seen[p.out] == nil {
			seen[p.out] = make(map[kvindex.Key]struct{})
		}
		for _, k := range b.Keys() {
			if len(o.Keys) >= maxKeys {
				break
			}
			if _, dup := seen[p.out][k]; !dup {
				seen[p.out][k] = struct{}{}
				o.Keys = append(o.Keys, k)
			}
		}
	}
	return out
}

// bookedLocked is what a pick sees as worker name's bookings: this replica's own
// plus the peers'. Caller holds r.mu (for the flight).
func (r *Router) bookedLocked(name string) scoring.Booked {
	var b scoring.Booked
	if f := r.flights[name]; f != nil {
		b = f.booked
	}
	return addPeer(b, r.peerBooked.Load(), name)
}

func addPeer(b scoring.Booked, peers *map[string]scoring.Booked, name string) scoring.Booked {
	if peers == nil {
		return b
	}
	if p, ok := (*peers)[name]; ok {
		b.Requests += p.Requests
		b.PrefillTokens += p.PrefillTokens
		b.Prefilling += p.Prefilling
		b.Decoding += p.Decoding
	}
	return b
}
