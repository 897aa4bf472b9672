package admission

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/router"
)

// RejectedReasonHeader names the cause of a refusal by kvroute's queue (ReasonQueueFull,
// ReasonShed, ReasonQueueTimeout).
const RejectedReasonHeader = router.RejectedReasonHeader

// ClassInput is what classification reads (config.ClassMatch).
type ClassInput struct {
	Tenant   string
	API      request.API
	Model    string
	Header   func(name string) string // lower-case names; nil: no headers
	Metadata map[string]*structpb.Struct
	// PromptTokens is the prompt length the router counted (0 unknown).
	PromptTokens int
	// Class is the class a classification rule chose (config.ClassifyRule.Class): when
	// it names a configured class (or "default"), that class wins over the matches.
	Class string
}

var defaultClass = config.Class{Name: config.DefaultClass}

// Classify returns the class of in: the first of admission.classes whose rules all
// hold, else the class named "default" when configured, else the built-in default
// (priority 0, no objective, no queue).
func (a *Admitter) Classify(in ClassInput) *config.Class {
	if a == nil {
		return &defaultClass
	}
	if in.Class != "" {
		for i := range a.cfg.Classes {
			if a.cfg.Classes[i].Name == in.Class {
				return &a.cfg.Classes[i]
			}
		}
		if in.Class == config.DefaultClass {
			return &defaultClass
		}
	}
	for i := range a.cfg.Classes {
		if a.matches(&a.cfg.Classes[i].Match, in) {
			return &a.cfg.Classes[i]
		}
	}
	for i := range a.cfg.Classes {
		if a.cfg.Classes[i].Name == config.DefaultClass {
			return &a.cfg.Classes[i]
		}
	}
	return &defaultClass
}

func (a *Admitter) matches(m *config.ClassMatch, in ClassInput) bool {
	if len(m.Tenants) > 0 && !slices.Contains(m.Tenants, in.Tenant) ||
		len(m.APIs) > 0 && !slices.Contains(m.APIs, string(in.API)) ||
		len(m.Models) > 0 && !slices.Contains(m.Models, in.Model) {
		return false
	}
	if m.MinPromptTokens > 0 && in.PromptTokens < m.MinPromptTokens ||
		m.MaxPromptTokens > 0 && (in.PromptTokens <= 0 || in.PromptTokens > m.MaxPromptTokens) {
		return false
	}
	for k, v := range m.Headers {
		if in.Header == nil || in.Header(k) != v {
			return false
		}
	}
	for k, v := range m.Claims {
		if claim(in.Metadata, a.cfg.MetadataNamespace, a.cfg.MetadataKey, k) != v {
			return false
		}
	}
	return true
}

// objective is the SLO a request of class c picks with: the client's (x-slo-ttft-ms)
// capped by the class's TTFT objective; either alone when the other is 0.
func objective(c *config.Class, client time.Duration) time.Duration {
	switch {
	case client <= 0:
		return c.TTFTObjective
	case c.TTFTObjective <= 0:
		return client
	}
	return min(client, c.TTFTObjective)
}

// Policy is what class c decides for a request's pick whose client asked for the TTFT
// objective client (x-slo-ttft-ms; 0 none): the objective (the smaller of the two),
// whether it may wait in kvroute's queue (queued: the front has one and the class a
// queue_limit), whether it is refused when no worker is predicted within the
// objective (on_slo_miss: refuse). kvroute serve, proxy and kvbench's virtual runs
// all decide through it.
func Policy(c *config.Class, client time.Duration, queued bool) router.ClassPolicy {
	return router.ClassPolicy{SLO: objective(c, client), Wait: queued && c.QueueLimit > 0,
		RefuseOnSLOMiss: c.OnSLOMiss == config.SLOMissRefuse, Class: c.Name, Priority: c.Priority, Attainment: c.SLOAttainment}
}

// AtDispatch is the class policy p of a request picked again after waiting waited in
// kvroute's queue: its objective is what is left of p.SLO, since the client counts the
// TTFT from its arrival, not from the dispatch. A request no worker is predicted to
// start within what is left is then refused at dispatch (on_slo_miss: refuse) rather
// than sent to miss its objective on capacity another request could use. Past the
// objective, 1 ns is left: refused in a refusing class, sent to the best worker (and
// counted a miss) in another. p unchanged when it has no objective or nothing waited.
func AtDispatch(p router.ClassPolicy, waited time.Duration) router.ClassPolicy {
	if p.SLO <= 0 || waited <= 0 {
		return p
	}
	p.SLO = max(p.SLO-waited, time.Nanosecond)
	return p
}

// Picked is Admitter.Pick's result.
type Picked struct {
	Ticket *router.Ticket
	Class  *config.Class
	Waited time.Duration // time spent in the queue
}

// Want is the Want of the picked ticket for a request with maxTokens, in p's class
// (the class label of the per-tenant metrics).
func (p Picked) Want(maxTokens int) Want {
	w := WantOf(p.Ticket, maxTokens)
	if p.Class != nil {
		w.Class = p.Class.Name
	}
	return w
}

// Pick classifies req, picks through rt and, when the request's class has a queue and
// the router answers router.ErrWait (every worker busy, none predicted to meet the
// class objective), waits in kvroute's queue until capacity frees and picks again then,
// with the freshest view (late binding). Errors: rt's *router.Error; a 429
// *router.Error with x-kvroute-rejected-reason when the queue refuses it (full, shed
// for higher priority, waited past max_queue_time); ctx's error when the client went
// away while waiting (its entry is removed). A nil Admitter picks once, class default.
// The picked request's weighted prompt is charged to its tenant's virtual token
// counter (VTC) at once; a front that budgets calls Admit instead, which charges only
// what the budget admits.
//
// 429 rather than 503 for every queue refusal: it is load, the client may retry after
// Retry-After, and Envoy's default retry_on (5xx, reset) does not re-send it at once
// into the same overload.
func (a *Admitter) Pick(ctx context.Context, rt *router.Router, req *request.Request, po router.PickOptions, in ClassInput) (Picked, error) {
	return a.pick(ctx, rt, req, po, in, nil)
}

// Admit is Pick then Reserve (for id, the picked ticket and req.MaxTokens) in one
// dispatch: the reservation is made in the request's turn of the queue, before the
// next waiter is tried, and the weighted prompt is charged to the tenant's virtual
// token counter only when the budget admits the request — a refused request costs its
// tenant no fairness. Errors: Pick's, and Reserve's 429 (or 503) *router.Error, after
// which the ticket is aborted (OutcomeRejected) and Picked.Ticket is nil. On success
// the Grant is to be settled exactly once (Grant); a nil Admitter picks once and
// returns a nil Grant.
func (a *Admitter) Admit(ctx context.Context, rt *router.Router, req *request.Request, po router.PickOptions, id Identity, in ClassInput) (Picked, *Grant, error) {
	var g *Grant
	pk, err := a.pick(ctx, rt, req, po, in, func(t *router.Ticket, cls *config.Class) error {
		w := WantOf(t, req.MaxTokens)
		w.Class = cls.Name
		var err error
		g, err = a.Reserve(id, w)
		return err
	})
	if err != nil {
		pk.Ticket = nil
		return pk, nil, err
	}
	if g != nil && pk.Ticket != nil && a.queue != nil {
		// what pick charged the tenant's VTC counter: Release gives it back
		g.vtcTenant, g.vtcPrompt = in.Tenant, a.promptCharge(pk.Ticket)
	}
	return pk, g, nil
}

// promptCharge is the VTC charge of t's prompt when it is dispatched: its uncached and
// cached tokens, weighted (admission.weights).
func (a *Admitter) promptCharge(t *router.Ticket) float64 {
	return float64(a.cost(t.PromptTokens-t.CachedTokens, t.CachedTokens, 0))
}

// pick is Pick; reserve (nil: none) is called with each ticket the router books, and
// an error from it aborts the ticket (OutcomeRejected) and ends the pick with it. The
// VTC prompt charge follows a reservation that succeeded.
func (a *Admitter) pick(ctx context.Context, rt *router.Router, req *request.Request, po router.PickOptions, in ClassInput, reserve func(*router.Ticket, *config.Class) error) (Picked, error) {
	var cls *config.Class
	var q *Queue
	if a != nil {
		q = a.queue
	}
	client := po.SLO
	in.API, in.Model = req.API, req.Model
	var queued time.Time // when the request joined the queue; zero before
	po.Classify = func(promptTokens int) router.ClassPolicy {
		in.PromptTokens = promptTokens
		cls = a.Classify(in)
		p := Policy(cls, client, q != nil)
		if !queued.IsZero() {
			p = AtDispatch(p, time.Since(queued))
		}
		return p
	}
	pick := func() (*router.Ticket, error) {
		t, err := rt.Pick(ctx, req, po)
		if re, ok := router.AsSLOMiss(err); ok && a != nil && cls != nil {
			a.refuse(a.labels.Labels(in.Tenant, cls.Name), router.ReasonSLOMiss)
			re.Header = append(re.Header, [2]string{"x-kvroute-class", cls.Name})
		}
		if err != nil || a == nil {
			return t, err
		}
		if reserve != nil {
			c := cls
			if c == nil {
				c = a.Classify(in)
			}
			if err := reserve(t, c); err != nil {
				t.AbortWith(response.OutcomeRejected)
				return nil, err
			}
		}
		q.charge(in.Tenant, a.promptCharge(t))
		return t, nil
	}
	t, err := pick()
	if cls == nil { // refused before classification (unknown model, no worker)
		cls = a.Classify(in)
	}
	if !errors.Is(err, router.ErrWait) {
		if err == nil && q != nil && cls.QueueLimit > 0 {
			q.observe(a.labels.Label(in.Tenant), cls.Name, 0)
		}
		return Picked{Ticket: t, Class: cls}, err
	}
	queued = time.Now()
	t, err = q.wait(ctx, in.Tenant, cls, pick)
	waited := time.Since(queued)
	q.observe(a.labels.Label(in.Tenant), cls.Name, waited)
	var reason string
	if re, ok := err.(*queueRefusal); ok {
		reason = re.reason
		a.refuse(a.labels.Labels(in.Tenant, cls.Name), reason)
		a.m.QueueRejected.WithLabelValues(cls.Name, reason).Inc()
		return Picked{Class: cls, Waited: waited}, rejection(reason, cls)
	}
	return Picked{Ticket: t, Class: cls, Waited: waited}, err
}

type queueRefusal struct{ reason string }

func (e *queueRefusal) Error() string { return "kvroute: queue: " + e.reason }

// rejection is the 429 for a queue refusal: Retry-After the class's max queue time
// (at least 1 s), x-kvroute-rejected-reason and x-kvroute-class.
func rejection(reason string, c *config.Class) *router.Error {
	msg := map[string]string{
		ReasonQueueFull:    "kvroute: the queue for class %q is full",
		ReasonShed:         "kvroute: shed from the queue of class %q for a request of higher priority",
		ReasonQueueTimeout: "kvroute: no capacity within class %q's max_queue_time",
	}[reason]
	return &router.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_exceeded", RetryAfter: max(c.MaxQueueTime, time.Second),
		Message: fmt.Sprintf(msg, c.Name), Details: "kvroute_" + reason,
		Header: [][2]string{{RejectedReasonHeader, reason}, {"x-kvroute-class", c.Name}}}
}

// Wake tells the queue that capacity freed (router.Router.OnCapacity); nil-safe.
func (a *Admitter) Wake() {
	if a != nil {
		a.queue.Wake()
	}
}

// QueueDepths is the number waiting per class with a queue (/debug/admission).
func (a *Admitter) QueueDepths() map[string]int {
	if a == nil {
		return map[string]int{}
	}
	return a.queue.Depths(a.cfg.Classes)
}

// Queue is the live front of FairQueue: requests wait on a channel each, and are woken
// in FairQueue's order when capacity frees (router.Router.OnCapacity: a ticket ended
// or got its first token, a peer's bookings changed) — no polling. One woken request
// at a time picks, in rounds (FairQueue.Round): a dispatch that succeeds wakes the
// next at once, since more may fit; one the router tells to wait is put back at its
// place (FairQueue.Refuse) and the next in order is tried — its preferred worker may
// have room — until the round's scan is spent or every waiter was tried; then the
// queue waits for the next wake-up (a new round at once when one came during an
// attempt). Deadlines
// (max_queue_time) are kept by one timer on the earliest. Time is the wall clock.
// Safe for concurrent use; a nil *Queue never queues.
type Queue struct {
	m *metrics.Admission

	mu     sync.Mutex
	q      *FairQueue
	trying bool        // a woken waiter is picking
	again  bool        // capacity freed while it was
	timer  *time.Timer // at q's earliest deadline
}

type waiter struct {
	e  *Entry
	ch chan string // "" your turn; else the refusal reason. Buffered: sent under mu, never blocks.
}

// NewQueue returns the queue for cfg's classes (those with queue_limit > 0); nil when
// none has one. fair selects VTC across tenants (true in kvroute; kvbench compares).
func NewQueue(cfg config.Admission, m *metrics.Admission, fair bool) *Queue {
	limits := map[string]int{}
	for _, c := range cfg.Classes {
		if c.QueueLimit > 0 {
			limits[c.Name] = c.QueueLimit
		}
	}
	if len(limits) == 0 {
		return nil
	}
	return &Queue{m: m, q: NewFairQueue(cfg.QueueMax, limits, fair)}
}

// Depths returns the number waiting per class with a queue (0 included).
func (q *Queue) Depths(classes []config.Class) map[string]int {
	out := map[string]int{}
	if q == nil {
		return out
	}
	q.mu.Lock()
	d := q.q.Depths()
	q.mu.Unlock()
	for _, c := range classes {
		if c.QueueLimit > 0 {
			out[c.Name] = d[c.Name]
		}
	}
	return out
}

func (q *Queue) charge(tenant string, tokens float64) {
	if q == nil {
		return
	}
	q.mu.Lock()
	q.q.Charge(tenant, tokens)
	q.mu.Unlock()
}

// refund takes tokens charged to tenant back (FairQueue.Refund).
func (q *Queue) refund(tenant string, tokens float64) {
	if q == nil {
		return
	}
	q.mu.Lock()
	q.q.Refund(tenant, tokens)
	q.mu.Unlock()
}

func (q *Queue) observe(tenant, class string, d time.Duration) {
	if q != nil {
		q.m.QueueSeconds.WithLabelValues(tenant, class).Observe(d.Seconds())
	}
}

// Wake is called when capacity frees: a new dispatch round (FairQueue.Round), the
// next waiter in order picks.
func (q *Queue) Wake() {
	if q == nil {
		return
	}
	q.mu.Lock()
	if q.trying {
		q.again = true
	} else {
		q.q.Round()
		q.wakeLocked()
	}
	q.mu.Unlock()
}

// wakeLocked hands the turn to the next waiter of the round (none: the round is over
// until the next Wake).
func (q *Queue) wakeLocked() {
	if q.trying {
		q.again = true
		return
	}
	if e := q.q.Pop(); e != nil {
		q.q.Hold(e) // its place in the limits stays taken while it picks
		q.trying, q.again = true, false
		q.depthLocked(e.Class)
		e.Tag.(*waiter).ch <- ""
	}
}

func (q *Queue) depthLocked(class string) {
	q.m.QueueDepth.WithLabelValues(class).Set(float64(q.q.Depth(class)))
}

// armLocked (re)sets the deadline timer at the earliest deadline.
func (q *Queue) armLocked() {
	d, ok := q.q.NextDeadline()
	if q.timer != nil {
		q.timer.Stop()
		q.timer = nil
	}
	if ok {
		q.timer = time.AfterFunc(time.Until(d), q.expire)
	}
}

func (q *Queue) expire() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, e := range q.q.Expire(time.Now()) {
		q.depthLocked(e.Class)
		e.Tag.(*waiter).ch <- ReasonQueueTimeout
	}
	q.armLocked()
}

// wait enqueues a request of tenant in class c and returns pick's result once it
// was its turn and pick found capacity (pick answering router.ErrWait puts it back).
func (q *Queue) wait(ctx context.Context, tenant string, c *config.Class, pick func() (*router.Ticket, error)) (*router.Ticket, error) {
	now := time.Now()
	w := &waiter{ch: make(chan string, 1)}
	w.e = &Entry{Tenant: tenant, Class: c.Name, Priority: c.Priority, Deadline: now.Add(c.MaxQueueTime), Tag: w}
	q.mu.Lock()
	shed, reason := q.q.Push(w.e, now)
	if reason != "" {
		q.mu.Unlock()
		return nil, &queueRefusal{reason}
	}
	if shed != nil {
		q.depthLocked(shed.Class)
		shed.Tag.(*waiter).ch <- ReasonShed
	}
	q.depthLocked(c.Name)
	q.armLocked()
	if !q.trying {
		// capacity may have freed between the router's answer and now (no wake-up
		// would come), and an arrival may fit where the round's refused ones did not:
		// the round goes on.
		q.wakeLocked()
	}
	q.mu.Unlock()
	for {
		select {
		case v := <-w.ch:
			if v != "" {
				return nil, &queueRefusal{v}
			}
			t, err := pick()
			q.mu.Lock()
			q.trying = false
			if errors.Is(err, router.ErrWait) {
				if !time.Now().Before(w.e.Deadline) {
					q.q.Release(w.e)
					if q.again {
						q.q.Round()
					}
					q.wakeLocked()
					q.mu.Unlock()
					return nil, &queueRefusal{ReasonQueueTimeout}
				}
				q.q.Refuse(w.e) // keeps its place; the round tries the next in order
				q.depthLocked(c.Name)
				q.armLocked()
				if q.again {
					q.q.Round()
				}
				q.wakeLocked()
				q.mu.Unlock()
				continue
			}
			q.q.Release(w.e)
			if q.again {
				q.q.Round()
			}
			q.wakeLocked() // dispatched (or refused for another cause): the next may fit too
			q.mu.Unlock()
			return t, err
		case <-ctx.Done():
			q.mu.Lock()
			if q.q.Remove(w.e) {
				q.depthLocked(c.Name)
				q.armLocked()
			} else if v := <-w.ch; v == "" {
				// popped for its turn as the client left: pass the turn on
				q.q.Release(w.e)
				q.trying = false
				q.wakeLocked()
			}
			q.mu.Unlock()
			return nil, ctx.Err()
		}
	}
}
