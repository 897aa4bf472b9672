package sim

import (
	"context"
	"sync"
	"time"
)

// RunnerOptions configures a real-time Runner.
type RunnerOptions struct {
	// OnBatch receives each step's KV events when the step ends (e.g. Publisher.Publish).
	OnBatch func(Batch)
	DPRank  int
	Now     func() time.Time // nil: time.Now
}

// Runner drives an Engine in real time: each step sleeps its modelled duration, then
// its tokens are delivered and its events published. Safe for concurrent use.
type Runner struct {
	opt     RunnerOptions
	mu      sync.Mutex // guards eng and streams
	eng     *Engine
	streams map[*Request]chan Output
	wake    chan struct{}
}

// NewRunner returns a Runner; call Run to start it.
func NewRunner(eng *Engine, opt RunnerOptions) *Runner {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	return &Runner{opt: opt, eng: eng, streams: map[*Request]chan Output{}, wake: make(chan struct{}, 1)}
}

// Submit queues r. The returned channel receives every Output of r and is closed after
// the Finished one (or after Cancel). It never blocks the engine.
func (r *Runner) Submit(req *Request) (<-chan Output, error) {
	ch := make(chan Output, req.MaxTokens+2)
	r.mu.Lock()
	defer r.mu.Unlock()
	if d := r.eng.Profile().RequestOverhead; d > 0 {
		// The request becomes schedulable after the profile's per-request overhead,
		// unless cancelled meanwhile (its stream is then gone).
		if err := r.eng.Check(req); err != nil {
			return nil, err
		}
		r.streams[req] = ch
		time.AfterFunc(d, func() {
			r.mu.Lock()
			_, live := r.streams[req]
			if live {
				_ = r.eng.Add(req) // checked above
			}
			r.mu.Unlock()
			if live {
				r.kick()
			}
		})
		return ch, nil
	}
	if err := r.eng.Add(req); err != nil {
		return nil, err
	}
	r.streams[req] = ch
	r.kick()
	return ch, nil
}

func (r *Runner) kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Cancel aborts req (client went away) and closes its channel.
func (r *Runner) Cancel(req *Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.eng.Abort(req)
	if ch, ok := r.streams[req]; ok {
		delete(r.streams, req)
		close(ch)
	}
}

// Stats returns the engine's statistics.
func (r *Runner) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.eng.Stats()
}

// ResetPrefixCache resets the engine's prefix cache and publishes AllBlocksCleared.
func (r *Runner) ResetPrefixCache() bool {
	r.mu.Lock()
	ok := r.eng.ResetPrefixCache()
	ev := r.eng.TakeEvents()
	r.mu.Unlock()
	r.publish(ev)
	return ok
}

func (r *Runner) publish(ev []Event) {
	if len(ev) > 0 && r.opt.OnBatch != nil {
		r.opt.OnBatch(Batch{TS: float64(r.opt.Now().UnixNano()) / 1e9, Events: ev, DPRank: r.opt.DPRank})
	}
}

// Release frees the blocks a finished prefill request holds for its remote decode
// engine (Engine.Release); it reports whether req held blocks.
func (r *Runner) Release(req *Request) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.eng.Release(req)
}

// Run steps the engine until ctx is cancelled.
func (r *Runner) Run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	last := time.Now()
	for {
		start := time.Now()
		r.mu.Lock()
		r.eng.Elapse(start.Sub(last)) // remote KV reads progress in real time
		last = start
		d, outs, ev, ok := r.eng.Step()
		load, loading := r.eng.NextLoad()
		r.mu.Unlock()
		if !ok {
			var until <-chan time.Time
			if loading { // wake when the next remote read ends, or earlier for a new request
				timer.Reset(max(load, time.Millisecond))
				until = timer.C
			}
			select {
			case <-ctx.Done():
				return
			case <-r.wake:
				timer.Stop() // Go ≥ 1.23: no stale tick is left in timer.C
			case <-until:
			}
			continue
		}
		if wait := d - time.Since(start); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		}
		r.publish(ev)
		r.mu.Lock()
		for _, o := range outs {
			ch, ok := r.streams[o.Req]
			if !ok {
				continue
			}
			ch <- o
			if o.Finished {
				delete(r.streams, o.Req)
				close(ch)
			}
		}
		r.mu.Unlock()
	}
}
