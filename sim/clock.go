package sim

import (
	"container/heap"
	"time"
)

// Clock is a discrete-event virtual clock: callbacks run in time order (FIFO among
// equal times) and Now jumps to each callback's time. Not safe for concurrent use;
// everything in a virtual-time simulation runs on one goroutine.
type Clock struct {
	now time.Time
	q   evq
	n   uint64
}

// NewClock returns a clock starting at start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the virtual time.
func (c *Clock) Now() time.Time { return c.now }

// At schedules fn at time t (clamped to now).
func (c *Clock) At(t time.Time, fn func()) {
	if t.Before(c.now) {
		t = c.now
	}
	c.n++
	heap.Push(&c.q, qe{t, c.n, fn})
}

// After schedules fn d after now.
func (c *Clock) After(d time.Duration, fn func()) { c.At(c.now.Add(d), fn) }

// Run runs callbacks until none is left.
func (c *Clock) Run() {
	for c.q.Len() > 0 {
		e := heap.Pop(&c.q).(qe)
		c.now = e.at
		e.fn()
	}
}

// Pending returns the number of scheduled callbacks.
func (c *Clock) Pending() int { return c.q.Len() }

type qe struct {
	at time.Time
	n  uint64
	fn func()
}

type evq []qe

func (q evq) Len() int { return len(q) }
func (q evq) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].n < q[j].n
}
func (q evq) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *evq) Push(x any)   { *q = append(*q, x.(qe)) }
func (q *evq) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// VirtualEngine drives an Engine on a Clock: the same model as Runner, in virtual time.
type VirtualEngine struct {
	Engine  *Engine
	clock   *Clock
	busy    bool
	onOut   func(Output)
	onBatch func(Batch)
	dpRank  int
	last    time.Time // when Engine.Elapse was last told the time
	wakeAt  time.Time // a pending wake-up for a remote KV read; zero when none
}

// NewVirtualEngine wraps eng. onOut gets every output at its step's end; onBatch (may be
// nil) gets each step's KV events at the step's end, TS in virtual Unix seconds.
func NewVirtualEngine(eng *Engine, clock *Clock, onOut func(Output), onBatch func(Batch)) *VirtualEngine {
	return &VirtualEngine{Engine: eng, clock: clock, onOut: onOut, onBatch: onBatch, last: clock.Now()}
}

// Submit checks req now and adds it after the profile's RequestOverhead (at once when
// zero), starting to step if the engine was idle.
func (v *VirtualEngine) Submit(req *Request) error {
	if err := v.Engine.Check(req); err != nil {
		return err
	}
	if d := v.Engine.Profile().RequestOverhead; d > 0 {
		v.clock.After(d, func() { v.add(req) })
		return nil
	}
	v.add(req)
	return nil
}

func (v *VirtualEngine) add(req *Request) {
	_ = v.Engine.Add(req) // checked by Submit; the profile does not change
	if !v.busy {
		v.busy = true
		v.step()
	}
}

func (v *VirtualEngine) step() {
	now := v.clock.Now()
	v.Engine.Elapse(now.Sub(v.last)) // remote KV reads progress in virtual time
	v.last = now
	d, outs, ev, ok := v.Engine.Step()
	if !ok {
		v.busy = false
		if wait, loading := v.Engine.NextLoad(); loading {
			at := now.Add(wait)
			if v.wakeAt.IsZero() || at.Before(v.wakeAt) {
				v.wakeAt = at
				v.clock.At(at, func() {
					if v.wakeAt.Equal(at) {
						v.wakeAt = time.Time{}
					}
					if !v.busy {
						v.busy = true
						v.step()
					}
				})
			}
		}
		return
	}
	v.clock.After(d, func() {
		if len(ev) > 0 && v.onBatch != nil {
			v.onBatch(Batch{TS: float64(v.clock.Now().UnixNano()) / 1e9, Events: ev, DPRank: v.dpRank})
		}
		for _, o := range outs {
			v.onOut(o)
		}
		v.step()
	})
}

// Release frees the blocks a finished prefill request holds for its remote decode
// engine (Engine.Release) and resumes stepping if the engine was idle (requests may
// have waited for those blocks); it reports whether req held blocks.
func (v *VirtualEngine) Release(req *Request) bool {
	ok := v.Engine.Release(req)
	if ok && !v.busy {
		v.busy = true
		v.step()
	}
	return ok
}
