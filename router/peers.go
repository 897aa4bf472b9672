package router

import (
	"math"
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
	// FirstTokens and Finished are when this replica's requests on Worker left the
	// engine's waiting queue (first token, or ended before it) and its running set
	// (ended after the first token), ascending, the last MaxLeftEvents of each within
	// LeftWindow. A receiver's scrape taken before them still counts those requests
	// waiting / running although no replica books them so any more
	// (scoring.Candidate.PeerLeft).
	FirstTokens, Finished []time.Time
	// Writes is this replica's policy's decayed cache writes to Worker at WritesAt,
	// tokens (scoring.WriteSharer; 0 when the policy keeps none).
	Writes   float64
	WritesAt time.Time
}

// MaxLeftEvents bounds the first-token and finish times a replica keeps and reports per
// worker (WorkerBookings.FirstTokens, Finished): more than a scrape interval's worth on
// one worker at any realistic rate.
const MaxLeftEvents = 128

// LeftWindow is how far back LocalBookings reports those times: a scrape older than
// this counts at most 0.5^5 at the default 2 s scoring.load_half_life.
const LeftWindow = 10 * time.Second

// PeerWorker is what peer replicas hold on one worker, summed over peers: their
// bookings, and when their requests there left the waiting queue / running set
// (WorkerBookings.FirstTokens, Finished, merged; any order).
type PeerWorker struct {
	scoring.Booked
	FirstTokens, Finished []time.Time
	// Writes are the peers' decayed cache writes to the worker, one per peer, each at
	// the time it reported it (WorkerBookings.Writes, WritesAt).
	Writes []PeerWrites
	// DuplicateBlocks counts the blocks peers report as being prefilled on the worker
	// (WorkerBookings.Keys) that this replica, or a peer merged before, is prefilling
	// there too, once per extra copy. Set by SetPeerBookings. Replicas that picked the
	// worker for one new prefix within the same exchange lag each booked its prefill in
	// full, but the engine computes a block once: a request queued behind another
	// prefilling the same prefix finds its blocks cached when it is scheduled (vLLM's
	// prefix cache, vllm/v1/core/kv_cache_manager.py get_computed_blocks) — what one
	// replica assumes of its own second pick, which sees the first's speculative
	// entries. The pick counts DuplicateBlocks × block size tokens less of the peers'
	// Booked.PrefillTokens (never below 0).
	DuplicateBlocks int

	keys [][]kvindex.Key // each merged peer's reported keys (Add), for SetPeerBookings
}

// Add merges one peer's report for the worker into w: its bookings (Booked.AddShared),
// first-token and finish times, its decayed writes when it reported any, and the block
// keys it is prefilling there (deduplicated, as WorkerBookings.Keys; kept by reference,
// not to be modified), which SetPeerBookings counts into DuplicateBlocks. The receiver
// (package peers) and kvbench's virtual replicas sum every peer's this way.
func (w *PeerWorker) Add(b scoring.Booked, firstTokens, finished []time.Time, writes PeerWrites, keys []kvindex.Key) {
	w.Booked.AddShared(b)
	w.FirstTokens = append(w.FirstTokens, firstTokens...)
	w.Finished = append(w.Finished, finished...)
	if writes.Tokens > 0 {
		w.Writes = append(w.Writes, writes)
	}
	if len(keys) > 0 {
		w.keys = append(w.keys, keys)
	}
}

// PeerWrites is one peer's decayed cache writes to a worker, tokens, as of At.
type PeerWrites struct {
	Tokens float64
	At     time.Time
}

// leftEvents are one worker's recent first-token and finish times (this replica's).
type leftEvents struct{ first, finished timeRing }

// timeRing keeps the last MaxLeftEvents times added, in the order added.
type timeRing struct {
	t    [MaxLeftEvents]time.Time
	n    int
	next int
}

func (r *timeRing) add(at time.Time) {
	r.t[r.next] = at
	r.next = (r.next + 1) % MaxLeftEvents
	r.n = min(r.n+1, MaxLeftEvents)
}

// after returns the kept times after t, oldest first (nil none).
func (r *timeRing) after(t time.Time) []time.Time {
	var out []time.Time
	for i := r.n; i >= 1; i-- {
		if at := r.t[(r.next-i+MaxLeftEvents)%MaxLeftEvents]; at.After(t) {
			out = append(out, at)
		}
	}
	return out
}

// countAfter counts the times in ts after t.
func countAfter(ts []time.Time, t time.Time) int {
	k := 0
	for _, at := range ts {
		if at.After(t) {
			k++
		}
	}
	return k
}

// SetPeerBookings replaces what peer replicas hold, per worker name (summed over
// peers); nil clears it. Every pick adds their bookings to the candidate's own
// (Candidate.Booked) and counts their requests that left the worker after its scrape
// (Candidate.PeerLeft). m must not be modified afterwards. Lock-free (an atomic store).
func (r *Router) SetPeerBookings(m map[string]PeerWorker) {
	if len(m) == 0 {
		r.peerBooked.Store(nil)
	} else {
		r.countDuplicates(m)
		r.peerBooked.Store(&m)
	}
	r.capacityFreed() // a peer's booking may have ended: a waiting request may now fit
}

// countDuplicates sets each entry's DuplicateBlocks: per worker, the peers' reported
// keys already seen — among this replica's prefilling requests' speculative entries
// there (the keys LocalBookings reports) or an earlier-merged peer's — counted once
// per repeat. O(keys); r.mu is held only to list the prefilling tickets.
func (r *Router) countDuplicates(m map[string]PeerWorker) {
	var any bool
	for _, p := range m {
		if len(p.keys) > 0 {
			any = true
			break
		}
	}
	if !any {
		return
	}
	type spec struct {
		worker string
		b      *kvindex.Booking
	}
	var own []spec
	r.mu.Lock()
	for _, t := range r.tickets {
		if !t.firstAt.IsZero() || len(m[t.Worker].keys) == 0 {
			continue
		}
		if b := t.spec.Load(); b != nil && !t.released.Load() {
			own = append(own, spec{t.Worker, b})
		}
	}
	r.mu.Unlock()
	seen := make(map[string]map[kvindex.Key]struct{}, len(m))
	for _, o := range own {
		set := seen[o.worker]
		if set == nil {
			set = make(map[kvindex.Key]struct{})
			seen[o.worker] = set
		}
		for _, k := range o.b.Keys() {
			set[k] = struct{}{}
		}
	}
	for name, p := range m {
		if len(p.keys) == 0 {
			continue
		}
		set := seen[name]
		if set == nil {
			set = make(map[kvindex.Key]struct{})
		}
		p.DuplicateBlocks = 0
		for _, keys := range p.keys {
			for _, k := range keys {
				if _, dup := set[k]; dup {
					p.DuplicateBlocks++
				} else {
					set[k] = struct{}{}
				}
			}
		}
		m[name] = p
	}
}

// PeerBookings returns what SetPeerBookings last stored (nil none); not to be modified.
func (r *Router) PeerBookings() map[string]PeerWorker {
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
	now := r.opt.Now()
	since := now.Add(-LeftWindow)
	ws, _ := r.opt.Policy.(scoring.WriteSharer)
	var names []string // flights with nothing else to report, for their writes
	for name, f := range r.flights {
		first, fin := f.left.first.after(since), f.left.finished.after(since)
		if f.booked.Requests <= 0 && first == nil && fin == nil {
			if ws != nil {
				names = append(names, name)
			}
			continue
		}
		at[name] = len(out)
		out = append(out, WorkerBookings{Worker: name, Booked: f.booked, FirstTokens: first, Finished: fin})
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
	if ws != nil {
		// Outside r.mu: the policy takes its own lock (Pick holds it under r.mu).
		for i := range out {
			out[i].Writes, out[i].WritesAt = ws.Writes(out[i].Worker, now), now
		}
		for _, name := range names {
			if v := ws.Writes(name, now); v >= 1 {
				out = append(out, WorkerBookings{Worker: name, Writes: v, WritesAt: now})
			}
		}
	}
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

// bookedLocked sets what a pick sees as c's bookings: this replica's own plus the
// peers', and the peers' requests that left c after its scrape. Caller holds r.mu (for
// the flight).
func (r *Router) bookedLocked(c *scoring.Candidate, now time.Time, blockSize int) {
	c.Booked = scoring.Booked{}
	if f := r.flights[c.Worker.Name]; f != nil {
		c.Booked = f.booked
	}
	addPeer(c, r.peerBooked.Load(), now, r.writeHalfLife(), blockSize)
}

// writeHalfLife is the policy's write half-life (scoring.WriteSharer); 0 none.
func (r *Router) writeHalfLife() time.Duration {
	if ws, ok := r.opt.Policy.(scoring.WriteSharer); ok {
		return ws.WriteHalfLife()
	}
	return 0
}

// addPeer adds the peers' bookings on c's worker to c.Booked (their prefill tokens less
// DuplicateBlocks × blockSize tokens), sets c.PeerLeft from their first-token and
// finish times after c.Load.ScrapedAt, and c.PeerWrites from their writes decayed to now.
func addPeer(c *scoring.Candidate, peers *map[string]PeerWorker, now time.Time, halfLife time.Duration, blockSize int) {
	c.PeerLeft, c.PeerWrites = scoring.Left{}, 0
	if peers == nil {
		return
	}
	p, ok := (*peers)[c.Worker.Name]
	if !ok {
		return
	}
	c.Booked.AddShared(p.Booked)
	c.Booked.PrefillTokens -= min(p.DuplicateBlocks*max(blockSize, 0), max(p.Booked.PrefillTokens, 0))
	if !c.Load.ScrapedAt.IsZero() {
		c.PeerLeft = scoring.Left{Waiting: countAfter(p.FirstTokens, c.Load.ScrapedAt), Running: countAfter(p.Finished, c.Load.ScrapedAt)}
	}
	c.PeerWrites = 0
	for _, w := range p.Writes {
		c.PeerWrites += w.Tokens * decay(now.Sub(w.At), halfLife)
	}
}

// decay is 0.5^(age/halfLife); 1 for age ≤ 0 or halfLife ≤ 0.
func decay(age, halfLife time.Duration) float64 {
	if age <= 0 || halfLife <= 0 {
		return 1
	}
	return math.Exp2(-float64(age) / float64(halfLife))
}
