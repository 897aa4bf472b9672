package router

import (
	"context"
	"time"

	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/workers"
)

// Sweep releases tickets older than TicketTTL and returns how many it released.
func (r *Router) Sweep() int {
	now := r.opt.Now()
	var expired []*Ticket
	r.mu.Lock()
	for _, t := range r.tickets {
		if now.Sub(t.Start) > r.opt.TicketTTL {
			expired = append(expired, t)
		}
	}
	for _, t := range expired {
		r.releaseLocked(t, response.OutcomeExpired)
	}
	r.mu.Unlock()
	if n := len(expired); n > 0 {
		r.m.TicketsReleased.WithLabelValues("expired").Add(float64(n))
		r.capacityFreed()
	}
	return len(expired)
}

// Run sweeps expired tickets every TicketTTL/4 (at least every second, at most every
// minute) until ctx is cancelled.
func (r *Router) Run(ctx context.Context) {
	every := min(max(r.opt.TicketTTL/4, time.Second), time.Minute)
	tk := time.NewTicker(every)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
			r.Sweep()
		}
	}
}

type registryListener struct{ r *Router }

func (l registryListener) WorkerAdded(*workers.Worker) {}

func (l registryListener) WorkerRemoved(w *workers.Worker) {
	r := l.r
	n := 0
	r.mu.Lock()
	for _, t := range r.tickets {
		if t.on == w.Name {
			r.releaseLocked(t, response.OutcomeAborted)
			n++
		}
	}
	r.prefillRemovedLocked(w.Name)
	delete(r.flights, w.Name)
	r.pub.Delete(w.Name)
	r.m.InFlight.DeleteLabelValues(w.Name)
	r.m.InFlightTokens.DeleteLabelValues(w.Name)
	r.mu.Unlock()
	if n > 0 {
		r.capacityFreed()
		r.m.TicketsReleased.WithLabelValues("worker_removed").Add(float64(n))
	}
	if r.opt.Index != nil {
		r.specMu.Lock() // a booking in progress lands first; later ones see their ticket released
		r.opt.Index.RemoveWorker(w.Name)
		r.specMu.Unlock()
	}
}
