package admission

import (
	"slices"
	"time"
)

// Reasons a queued request is refused, the value of x-kvroute-rejected-reason and of
// kvroute_admission_queue_rejected_total{reason}.
const (
	ReasonQueueFull    = "queue_full"    // its class's queue_limit or admission.queue_max reached, nothing of lower priority to shed
	ReasonShed         = "queue_shed"    // shed from a full queue for an arrival of higher priority
	ReasonQueueTimeout = "queue_timeout" // waited past its class's max_queue_time
)

// Entry is one waiting request in a FairQueue.
type Entry struct {
	Tenant   string
	Class    string
	Priority int       // higher is served first
	Arrived  time.Time // when it started waiting
	Deadline time.Time // Arrived + the class's max_queue_time: Expire refuses it from then on
	Tag      any       // the caller's (the live Queue's waiter, kvbench's request)

	seq uint64 // arrival order, kept across Requeue
}

// FairQueue is the ordering and dispatch core of kvroute's queue: a pure data
// structure, no goroutines and no clock — every method takes the time it acts at — so
// the live Queue (goroutine wake-ups) and kvbench (virtual time) run the same code. Not
// safe for concurrent use.
//
// Pop's order:
//
//  1. priority band: the highest Priority with a waiting entry;
//  2. within it, when fair, the tenant with the smallest virtual token counter — the
//     Virtual Token Counter (VTC) of Sheng et al., "Fairness in Serving Large Language
//     Models", OSDI '24: every tenant's counter grows by the tokens served to it
//     (Charge: kvroute charges the weighted prompt at dispatch, once the tenant's
//     budget admitted it (Admitter.Admit), and the output at settlement, in
//     admission.weights' units), and a tenant that starts waiting is
//     lifted to at least the smallest counter among the tenants waiting (or, with
//     nobody waiting, to the counter of the last tenant that stopped waiting), so idle
//     time banks no credit (the paper's counter lift). Not fair: every tenant alike;
//  3. FCFS: the earliest arrival (of that tenant).
//
// Bounds: at most max entries in all, limit[class] per class; counters are kept for at
// most maxCounters tenants (idle tenants at or below the lift floor are forgotten
// first: they would be lifted to it anyway). Pop, Expire and NextDeadline are
// O(entries waiting), bounded by max.
type FairQueue struct {
	fair     bool
	max      int
	limit    map[string]int
	seq      uint64
	n        int
	byClass  map[string]int
	tenants  map[string][]*Entry // waiting, by tenant, in seq order
	counter  map[string]float64  // VTC counters
	lastLeft float64             // counter of the tenant that last stopped waiting

	// the dispatch round (Round, Refuse): entries told to wait since capacity last
	// freed are skipped by Pop; after scan of them Pop returns nil
	refused  map[*Entry]bool
	refusals int
	scan     int

	// held: entries popped and being tried (Hold), counted against the limits until
	// given back or Released
	held      map[*Entry]bool
	heldClass map[string]int
}

// DefaultScan is how many entries a dispatch round tries that the router tells to
// wait before it stops (FairQueue.SetScan): the bound of the scan past a head of the
// line that cannot be placed.
const DefaultScan = 8

// maxCounters bounds the tenants with a VTC counter.
const maxCounters = 4096

// NewFairQueue returns a queue of at most max entries (≥ 1) and limit[class] per class
// (a class not listed may not wait); fair selects VTC across tenants (else FCFS within
// a priority band).
func NewFairQueue(size int, limit map[string]int, fair bool) *FairQueue {
	return &FairQueue{fair: fair, max: max(size, 1), limit: limit, byClass: map[string]int{},
		tenants: map[string][]*Entry{}, counter: map[string]float64{}, refused: map[*Entry]bool{}, scan: DefaultScan,
		held: map[*Entry]bool{}, heldClass: map[string]int{}}
}

// SetScan sets how many refused entries end a dispatch round (≥ 1; DefaultScan).
func (q *FairQueue) SetScan(n int) { q.scan = max(n, 1) }

// Round starts a dispatch round: capacity freed (router.Router.OnCapacity), so every
// waiting entry may be tried again.
//
// A round is how the queue avoids both idle capacity and head-of-line blocking: the
// caller pops, tries the pick, and on success pops again (as many as fit: the loop
// ends only when the router says wait); an entry the router tells to wait is given
// back with Refuse, keeps its place, and Pop goes on to the next in order — a request
// whose preferred worker has room may sit behind one whose worker is saturated — until
// scan entries were refused (the bound on picks per round that book nothing) or every
// waiting entry was tried.
func (q *FairQueue) Round() {
	clear(q.refused)
	q.refusals = 0
}

// Refuse puts back an entry Pop returned that the router told to wait: it keeps its
// place (as Requeue) and is skipped by Pop until the next Round.
func (q *FairQueue) Refuse(e *Entry) {
	q.unhold(e)
	q.insert(e)
	q.refused[e] = true
	q.refusals++
}

// SetLimit sets class's queue limit (0: the class may not wait).
func (q *FairQueue) SetLimit(class string, limit int) { q.limit[class] = limit }

// Len is the number of waiting entries.
func (q *FairQueue) Len() int { return q.n }

// Depth is the number of waiting entries of class.
func (q *FairQueue) Depth(class string) int { return q.byClass[class] }

// Counter is tenant's virtual token counter (tokens, admission.weights' units).
func (q *FairQueue) Counter(tenant string) float64 { return q.counter[tenant] }

// Charge adds tokens served to tenant's virtual token counter (VTC: the prompt when
// dispatched, the output when it is known). Negative or zero tokens change nothing.
func (q *FairQueue) Charge(tenant string, tokens float64) {
	if tokens <= 0 {
		return
	}
	if _, ok := q.counter[tenant]; !ok {
		q.pruneCounters()
	}
	q.counter[tenant] += tokens
}

// Refund takes back tokens charged to tenant's virtual token counter for a request
// that was never served (its attempt released before anything reached a worker),
// never below 0; a tenant without a counter is left alone.
func (q *FairQueue) Refund(tenant string, tokens float64) {
	if c, ok := q.counter[tenant]; ok && tokens > 0 {
		q.counter[tenant] = max(c-tokens, 0)
	}
}

// floor is the lift floor: the smallest counter among waiting tenants, else lastLeft.
func (q *FairQueue) floor() float64 {
	first, f := true, q.lastLeft
	for t := range q.tenants {
		if c := q.counter[t]; first || c < f {
			f, first = c, false
		}
	}
	return f
}

func (q *FairQueue) pruneCounters() {
	if len(q.counter) < maxCounters {
		return
	}
	f := q.floor()
	for t, c := range q.counter {
		if _, waiting := q.tenants[t]; !waiting && c <= f {
			delete(q.counter, t)
		}
	}
	for t := range q.counter { // still full: forget any idle tenant
		if len(q.counter) < maxCounters {
			break
		}
		if _, waiting := q.tenants[t]; !waiting {
			delete(q.counter, t)
		}
	}
}

// Push adds e, arriving at now, unless its class may not wait or is full (reason
// ReasonQueueFull). When the whole queue is full, the latest arrival of the lowest
// priority band below e's is shed to make room and returned (its waiter must be told
// ReasonShed); with nothing lower, e is refused (ReasonQueueFull). Held entries
// (Hold) count as waiting for both limits: given back, they would exceed them.
func (q *FairQueue) Push(e *Entry, now time.Time) (shed *Entry, reason string) {
	if q.byClass[e.Class]+q.heldClass[e.Class] >= q.limit[e.Class] {
		return nil, ReasonQueueFull
	}
	if q.n+len(q.held) >= q.max {
		if shed = q.lowest(e.Priority); shed == nil {
			return nil, ReasonQueueFull
		}
		q.Remove(shed)
	}
	q.seq++
	e.seq, e.Arrived = q.seq, now
	q.insert(e)
	return shed, ""
}

// Requeue puts back an entry Pop returned whose dispatch found no capacity: it keeps
// its arrival order and deadline, and is not counted against the limits again (it
// held its place while being tried: see Hold).
func (q *FairQueue) Requeue(e *Entry) {
	q.unhold(e)
	q.insert(e)
}

// Hold keeps a popped entry's place in the limits while it is tried outside the
// queue's lock (the live Queue): until it is given back (Refuse, Requeue) or Released
// (dispatched, refused for good, its client gone), Push counts it against its class's
// queue_limit and the queue's size, so giving it back never exceeds either. A caller
// that gives an entry back before anything else is pushed (kvbench, in virtual time)
// needs no Hold.
func (q *FairQueue) Hold(e *Entry) {
	if !q.held[e] {
		q.held[e] = true
		q.heldClass[e.Class]++
	}
}

// Release ends e's Hold (no-op when not held).
func (q *FairQueue) Release(e *Entry) { q.unhold(e) }

func (q *FairQueue) unhold(e *Entry) {
	if !q.held[e] {
		return
	}
	delete(q.held, e)
	if q.heldClass[e.Class]--; q.heldClass[e.Class] <= 0 {
		delete(q.heldClass, e.Class)
	}
}

func (q *FairQueue) insert(e *Entry) {
	l, ok := q.tenants[e.Tenant]
	if !ok {
		// VTC counter lift: a tenant that starts waiting banks no idle credit.
		f := q.floor()
		if _, known := q.counter[e.Tenant]; !known {
			q.pruneCounters()
		}
		q.counter[e.Tenant] = max(q.counter[e.Tenant], f)
	}
	i, _ := slices.BinarySearchFunc(l, e.seq, func(x *Entry, s uint64) int { return cmpU(x.seq, s) })
	q.tenants[e.Tenant] = slices.Insert(l, i, e)
	q.n++
	q.byClass[e.Class]++
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// lowest is the latest arrival of the lowest priority band below p; nil when none.
func (q *FairQueue) lowest(p int) *Entry {
	var v *Entry
	for _, l := range q.tenants {
		for _, e := range l {
			if e.Priority < p && (v == nil || e.Priority < v.Priority || e.Priority == v.Priority && e.seq > v.seq) {
				v = e
			}
		}
	}
	return v
}

// Remove takes e out of the queue (shed, expired, or its client went away); false when
// it was not waiting.
func (q *FairQueue) Remove(e *Entry) bool {
	l := q.tenants[e.Tenant]
	i := slices.Index(l, e)
	if i < 0 {
		return false
	}
	q.take(e.Tenant, i)
	return true
}

func (q *FairQueue) take(tenant string, i int) *Entry {
	l := q.tenants[tenant]
	e := l[i]
	l = slices.Delete(l, i, i+1)
	if len(l) == 0 {
		delete(q.tenants, tenant)
		q.lastLeft = q.counter[tenant]
	} else {
		q.tenants[tenant] = l
	}
	q.n--
	delete(q.refused, e)
	if q.byClass[e.Class]--; q.byClass[e.Class] == 0 {
		delete(q.byClass, e.Class)
	}
	return e
}

// Pop removes and returns the entry to dispatch next (order in the type's doc), of
// those not refused in this round (Round); nil when there is none or the round
// refused its scan of entries already. Entries past their deadline are not returned:
// Expire them first.
func (q *FairQueue) Pop() *Entry {
	if q.refusals >= q.scan {
		return nil
	}
	var best *Entry
	for _, l := range q.tenants {
		for _, e := range l {
			if !q.refused[e] && (best == nil || q.before(e, best)) {
				best = e
			}
		}
	}
	if best == nil {
		return nil
	}
	l := q.tenants[best.Tenant]
	return q.take(best.Tenant, slices.Index(l, best))
}

// before reports whether a is dispatched before b.
func (q *FairQueue) before(a, b *Entry) bool {
	if a.Priority != b.Priority {
		return a.Priority > b.Priority
	}
	if q.fair && a.Tenant != b.Tenant {
		if ca, cb := q.counter[a.Tenant], q.counter[b.Tenant]; ca != cb {
			return ca < cb
		}
	}
	return a.seq < b.seq
}

// Expire removes and returns the entries whose deadline is at or before now, oldest
// first (each must be refused with ReasonQueueTimeout).
func (q *FairQueue) Expire(now time.Time) []*Entry {
	var out []*Entry
	for _, l := range q.tenants {
		for _, e := range l {
			if !e.Deadline.IsZero() && !now.Before(e.Deadline) {
				out = append(out, e)
			}
		}
	}
	slices.SortFunc(out, func(a, b *Entry) int { return cmpU(a.seq, b.seq) })
	for _, e := range out {
		q.Remove(e)
	}
	return out
}

// NextDeadline is the earliest deadline of a waiting entry; false when none.
func (q *FairQueue) NextDeadline() (time.Time, bool) {
	var d time.Time
	for _, l := range q.tenants {
		for _, e := range l {
			if !e.Deadline.IsZero() && (d.IsZero() || e.Deadline.Before(d)) {
				d = e.Deadline
			}
		}
	}
	return d, !d.IsZero()
}

// Depths is the number waiting per class (classes with none omitted).
func (q *FairQueue) Depths() map[string]int {
	out := make(map[string]int, len(q.byClass))
	for c, n := range q.byClass {
		out[c] = n
	}
	return out
}
