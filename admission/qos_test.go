package admission

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring/scoringtest"
	"github.com/kvroute/kvroute/workers"
)

func qosSetup(t *testing.T, classes []config.Class, names ...string) (*Admitter, *router.Router, *metrics.Set) {
	t.Helper()
	reg := workers.NewRegistry()
	var ws []*workers.Worker
	for i, n := range names {
		ws = append(ws, &workers.Worker{Name: n, Address: "10.0.0." + string(rune('1'+i)) + ":8000", Models: []string{"m"}})
	}
	reg.Set(ws)
	ms := metrics.NewUnregistered()
	// max_num_seqs 1: one booked request saturates a worker (router.Saturation)
	rt := router.New(router.Options{Registry: reg, Models: []router.Model{{Name: "m"}}, Metrics: ms, Policy: scoringtest.Busy{},
		Saturation: router.Saturation{MaxNumSeqs: 1}})
	c := config.Default().Admission
	c.Classes = classes
	a, err := New(Options{Config: c, Metrics: ms})
	if err != nil {
		t.Fatal(err)
	}
	rt.OnCapacity(a.Wake)
	return a, rt, ms
}

func qreq() *request.Request {
	return &request.Request{API: request.APICompletions, Model: "m", PromptTokenIDs: [][]uint32{{1, 2, 3, 4}}}
}

var interactive = config.Class{Name: "interactive", Priority: 10, TTFTObjective: 500 * time.Millisecond, QueueLimit: 10, MaxQueueTime: time.Hour}

// waitQueued waits (condition, no deadline of its own) until class has n waiting.
func waitQueued(t *testing.T, a *Admitter, class string, n int) {
	t.Helper()
	for a.QueueDepths()[class] != n {
		time.Sleep(time.Millisecond)
	}
}

type pickResult struct {
	p   Picked
	err error
}

func goPick(ctx context.Context, a *Admitter, rt *router.Router, tenant string) chan pickResult {
	ch := make(chan pickResult, 1)
	go func() {
		p, err := a.Pick(ctx, rt, qreq(), router.PickOptions{}, ClassInput{Tenant: tenant})
		ch <- pickResult{p, err}
	}()
	return ch
}

// Late binding: with every worker saturated and none predicted within the objective the
// request waits, and is picked when a ticket ends — on the worker that freed.
func TestQueueLateBindingPicksTheWorkerThatFreed(t *testing.T) {
	a, rt, ms := qosSetup(t, []config.Class{interactive}, "a", "b")
	ctx := context.Background()
	var ts []*router.Ticket
	for i := 0; i < 2; i++ {
		p, err := a.Pick(ctx, rt, qreq(), router.PickOptions{}, ClassInput{Tenant: "x"})
		if err != nil || p.Class.Name != "interactive" || p.Waited != 0 {
			t.Fatalf("pick %d: %+v %v", i, p, err)
		}
		ts = append(ts, p.Ticket)
	}
	ch := goPick(ctx, a, rt, "x")
	waitQueued(t, a, "interactive", 1)
	if got := testutil.ToFloat64(ms.Admission.QueueDepth.WithLabelValues("interactive")); got != 1 {
		t.Fatalf("queue depth gauge %v", got)
	}
	freed := ts[1]
	freed.Done(200, response.Usage{}, time.Time{})
	r := <-ch
	if r.err != nil || r.p.Ticket.Worker != freed.Worker || r.p.Waited <= 0 {
		t.Fatalf("queued pick: %+v %v, want worker %s", r.p, r.err, freed.Worker)
	}
	if a.QueueDepths()["interactive"] != 0 {
		t.Fatal("queue not empty")
	}
	if n := testutil.CollectAndCount(ms.Admission.QueueSeconds); n != 1 {
		t.Fatalf("queue_seconds series %d", n)
	}
}

// A request waiting past max_queue_time is refused 429 with the reason header; a class
// without a queue is picked at once even when every worker is busy (the default).
func TestQueueTimeoutAndDefaultUnchanged(t *testing.T) {
	short := interactive
	short.MaxQueueTime = 20 * time.Millisecond
	a, rt, ms := qosSetup(t, []config.Class{{Name: "batch", Match: config.ClassMatch{Tenants: []string{"b"}}}, short}, "a")
	ctx := context.Background()
	if _, err := a.Pick(ctx, rt, qreq(), router.PickOptions{}, ClassInput{Tenant: "x"}); err != nil {
		t.Fatal(err)
	}
	// batch (no queue, no objective) goes through although the worker is busy
	p, err := a.Pick(ctx, rt, qreq(), router.PickOptions{}, ClassInput{Tenant: "b"})
	if err != nil || p.Class.Name != "batch" || p.Ticket == nil {
		t.Fatalf("batch: %+v %v", p, err)
	}
	r := <-goPick(ctx, a, rt, "x")
	var re *router.Error
	if !errors.As(r.err, &re) || re.Status != http.StatusTooManyRequests || header(re, RejectedReasonHeader) != ReasonQueueTimeout ||
		header(re, "x-kvroute-class") != "interactive" {
		t.Fatalf("timeout: %v %+v", r.err, re)
	}
	if got := testutil.ToFloat64(ms.Admission.QueueRejected.WithLabelValues("interactive", ReasonQueueTimeout)); got != 1 {
		t.Fatalf("queue_rejected_total %v", got)
	}
	if got := testutil.ToFloat64(ms.Admission.Refused.WithLabelValues("x", "interactive", ReasonQueueTimeout)); got != 1 {
		t.Fatalf("refused_total %v", got)
	}
}

// A client that goes away while queued leaves the queue at once; the next capacity
// goes to the request behind it.
func TestQueueDisconnectRemoves(t *testing.T) {
	a, rt, _ := qosSetup(t, []config.Class{interactive}, "a")
	t1, err := a.Pick(context.Background(), rt, qreq(), router.PickOptions{}, ClassInput{Tenant: "x"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	gone := goPick(ctx, a, rt, "x")
	waitQueued(t, a, "interactive", 1)
	stays := goPick(context.Background(), a, rt, "y")
	waitQueued(t, a, "interactive", 2)
	cancel()
	if r := <-gone; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("gone: %v", r.err)
	}
	if d := a.QueueDepths()["interactive"]; d != 1 {
		t.Fatalf("depth %d after disconnect", d)
	}
	t1.Ticket.Abort()
	if r := <-stays; r.err != nil || r.p.Ticket == nil {
		t.Fatalf("stays: %v", r.err)
	}
}

// Priority in the live queue: when capacity frees, the higher class goes first even
// though it arrived later.
func TestQueuePriorityLive(t *testing.T) {
	low := config.Class{Name: "low", Priority: 0, TTFTObjective: 500 * time.Millisecond, QueueLimit: 10, MaxQueueTime: time.Hour,
		Match: config.ClassMatch{Tenants: []string{"l"}}}
	a, rt, _ := qosSetup(t, []config.Class{low, interactive}, "a")
	t1, _ := a.Pick(context.Background(), rt, qreq(), router.PickOptions{}, ClassInput{Tenant: "x"})
	lo := goPick(context.Background(), a, rt, "l")
	waitQueued(t, a, "low", 1)
	hi := goPick(context.Background(), a, rt, "x")
	waitQueued(t, a, "interactive", 1)
	t1.Ticket.Abort()
	var r pickResult
	select {
	case r = <-hi:
	case r = <-lo:
		t.Fatalf("the low-priority request was dispatched first: %+v", r)
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.p.Ticket.Abort() // frees the worker for the low one
	if r := <-lo; r.err != nil {
		t.Fatal(r.err)
	}
}

// Classification rules: tenant, API, model, header, claim and prompt length; the
// client's x-slo-ttft-ms is capped by the class objective.
func TestClassify(t *testing.T) {
	c := config.Default().Admission
	c.Classes = []config.Class{
		{Name: "long", Match: config.ClassMatch{MinPromptTokens: 1000}},
		{Name: "gold", Priority: 5, Match: config.ClassMatch{Headers: map[string]string{"x-tier": "gold"}, APIs: []string{"chat"}}},
		{Name: "acme", Match: config.ClassMatch{Tenants: []string{"acme"}, Models: []string{"m"}}},
	}
	a, err := New(Options{Config: c})
	if err != nil {
		t.Fatal(err)
	}
	hdr := func(k, v string) func(string) string {
		return func(n string) string {
			if n == k {
				return v
			}
			return ""
		}
	}
	cases := []struct {
		in   ClassInput
		want string
	}{
		{ClassInput{Tenant: "acme", Model: "m", PromptTokens: 5000}, "long"},
		{ClassInput{Tenant: "z", API: request.APIChat, Header: hdr("x-tier", "gold")}, "gold"},
		{ClassInput{Tenant: "z", API: request.APICompletions, Header: hdr("x-tier", "gold")}, "default"},
		{ClassInput{Tenant: "acme", Model: "m"}, "acme"},
		{ClassInput{Tenant: "acme", Model: "n"}, "default"},
		// a classification rule's class wins over the matches; an unknown one is ignored.
		{ClassInput{Tenant: "acme", Model: "m", Class: "gold"}, "gold"},
		{ClassInput{Tenant: "acme", Model: "m", Class: "default"}, "default"},
		{ClassInput{Tenant: "acme", Model: "m", Class: "nope"}, "acme"},
	}
	for _, tc := range cases {
		if got := a.Classify(tc.in).Name; got != tc.want {
			t.Errorf("%+v: class %s, want %s", tc.in, got, tc.want)
		}
	}
	obj := &config.Class{TTFTObjective: time.Second}
	if objective(obj, 2*time.Second) != time.Second || objective(obj, 300*time.Millisecond) != 300*time.Millisecond ||
		objective(obj, 0) != time.Second || objective(&config.Class{}, 300*time.Millisecond) != 300*time.Millisecond {
		t.Fatal("objective capping")
	}
}

func header(e *router.Error, name string) string {
	for _, h := range e.Header {
		if h[0] == name {
			return h[1]
		}
	}
	return ""
}

// Head-of-line in the live queue: the head waits for model m1's only worker; a request
// for m2 behind it is dispatched when m2's worker frees, without waiting for m1's.
func TestQueueHeadOfLineOtherModelGoesFirst(t *testing.T) {
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "a", Address: "10.0.0.1:8000", Models: []string{"m1"}},
		{Name: "b", Address: "10.0.0.2:8000", Models: []string{"m2"}}})
	ms := metrics.NewUnregistered()
	rt := router.New(router.Options{Registry: reg, Models: []router.Model{{Name: "m1"}, {Name: "m2"}}, Metrics: ms,
		Policy: scoringtest.Busy{}, Saturation: router.Saturation{MaxNumSeqs: 1}})
	c := config.Default().Admission
	c.Classes = []config.Class{interactive}
	a, err := New(Options{Config: c, Metrics: ms})
	if err != nil {
		t.Fatal(err)
	}
	rt.OnCapacity(a.Wake)
	ctx := context.Background()
	req := func(model string) *request.Request {
		return &request.Request{API: request.APICompletions, Model: model, PromptTokenIDs: [][]uint32{{1, 2, 3, 4}}}
	}
	pickM := func(model string) chan pickResult {
		ch := make(chan pickResult, 1)
		go func() {
			p, err := a.Pick(ctx, rt, req(model), router.PickOptions{}, ClassInput{Tenant: "x"})
			ch <- pickResult{p, err}
		}()
		return ch
	}
	ta := <-pickM("m1")
	tb := <-pickM("m2")
	if ta.err != nil || tb.err != nil || ta.p.Ticket.Worker != "a" || tb.p.Ticket.Worker != "b" {
		t.Fatalf("first picks: %+v %+v", ta, tb)
	}
	head := pickM("m1")
	waitQueued(t, a, "interactive", 1)
	behind := pickM("m2")
	waitQueued(t, a, "interactive", 2)
	tb.p.Ticket.Done(200, response.Usage{}, time.Time{}) // b frees; a does not
	select {
	case r := <-behind:
		if r.err != nil || r.p.Ticket.Worker != "b" {
			t.Fatalf("behind the head: %+v %v", r.p, r.err)
		}
	case r := <-head:
		t.Fatalf("the head was picked with a still saturated: %+v %v", r.p, r.err)
	case <-time.After(30 * time.Second): // a hang guard, not a speed bound
		t.Fatal("the m2 request stayed behind the m1 head")
	}
	waitQueued(t, a, "interactive", 1)
	ta.p.Ticket.Done(200, response.Usage{}, time.Time{})
	if r := <-head; r.err != nil || r.p.Ticket.Worker != "a" {
		t.Fatalf("head after a frees: %+v %v", r.p, r.err)
	}
}

// A request the token budget refuses costs its tenant no fairness: Admit charges the
// weighted prompt to the tenant's virtual token counter only when the reservation
// succeeds, and aborts the refused ticket (the worker it booked is free again). Before
// the fix the fronts called Pick (which charged the prompt) and then Reserve, so the
// refused tenant's counter grew by its prompt (4 tokens here) and it lost its turns.
func TestAdmitRefusedByBudgetChargesNoVTC(t *testing.T) {
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "a", Address: "10.0.0.1:8000", Models: []string{"m"}}})
	ms := metrics.NewUnregistered()
	rt := router.New(router.Options{Registry: reg, Models: []router.Model{{Name: "m"}}, Metrics: ms, Policy: scoringtest.Busy{},
		Saturation: router.Saturation{MaxNumSeqs: 1}})
	c := config.Default().Admission
	c.Classes = []config.Class{interactive}
	c.Tenants = []config.TenantLimits{{Name: "poor", Limits: config.Limits{TokensPerMinute: 1}}}
	a, err := New(Options{Config: c, Metrics: ms})
	if err != nil {
		t.Fatal(err)
	}
	rt.OnCapacity(a.Wake)
	ctx := context.Background()
	pk, g, err := a.Admit(ctx, rt, qreq(), router.PickOptions{}, Identity{Tenant: "poor"}, ClassInput{Tenant: "poor"})
	var re *router.Error
	if !errors.As(err, &re) || re.Status != http.StatusTooManyRequests || re.Details != "kvroute_admission_tokens" || pk.Ticket != nil || g != nil {
		t.Fatalf("poor tenant: %+v %v %v, want a 429 kvroute_admission_tokens and no ticket", pk, g, err)
	}
	if n := a.queue.q.Counter("poor"); n != 0 {
		t.Fatalf("refused tenant's VTC counter = %v, want 0", n)
	}
	// The refused ticket was aborted: the one worker (max_num_seqs 1) is not saturated,
	// so the next request is dispatched without waiting, and charged its prompt.
	pk, g, err = a.Admit(ctx, rt, qreq(), router.PickOptions{}, Identity{Tenant: "rich"}, ClassInput{Tenant: "rich"})
	if err != nil || pk.Ticket == nil || g == nil || pk.Waited != 0 {
		t.Fatalf("rich tenant: %+v %v %v, want dispatched at once", pk, g, err)
	}
	if n, want := a.queue.q.Counter("rich"), float64(a.cost(4, 0, 0)); n != want || want != 4 {
		t.Fatalf("admitted tenant's VTC counter = %v, want %v (its 4-token prompt)", n, want)
	}
	g.Settle(response.Result{Outcome: response.OutcomeOK}, 0)
	pk.Ticket.Abort()
}

// A grant released because its request reached no worker (the proxy's connect failure,
// retried on another worker) gives back the VTC prompt charge Admit made: a request
// picked twice and served once costs its tenant one prompt. Before the fix the counter
// held both attempts' prompts (8 tokens here, for one 4-token request served).
func TestReleasedGrantRefundsVTC(t *testing.T) {
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "a", Address: "10.0.0.1:8000", Models: []string{"m"}},
		{Name: "b", Address: "10.0.0.2:8000", Models: []string{"m"}}})
	ms := metrics.NewUnregistered()
	rt := router.New(router.Options{Registry: reg, Models: []router.Model{{Name: "m"}}, Metrics: ms, Policy: scoringtest.Busy{}})
	c := config.Default().Admission
	c.Classes = []config.Class{interactive}
	a, err := New(Options{Config: c, Metrics: ms})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	prompt := float64(a.cost(4, 0, 0))
	first, g1, err := a.Admit(ctx, rt, qreq(), router.PickOptions{}, Identity{Tenant: "t"}, ClassInput{Tenant: "t"})
	if err != nil || g1 == nil {
		t.Fatalf("first attempt: %v", err)
	}
	if n := a.queue.q.Counter("t"); n != prompt || prompt != 4 {
		t.Fatalf("after the first attempt the VTC counter = %v, want %v", n, prompt)
	}
	g1.Release() // connect refused: nothing reached worker a
	first.Ticket.Abort()
	if n := a.queue.q.Counter("t"); n != 0 {
		t.Fatalf("after Release the VTC counter = %v, want 0", n)
	}
	g1.Release() // a second Release refunds nothing more
	second, g2, err := a.Admit(ctx, rt, qreq(), router.PickOptions{Exclude: first.Ticket.Worker}, Identity{Tenant: "t"}, ClassInput{Tenant: "t"})
	if err != nil || g2 == nil || second.Ticket.Worker == first.Ticket.Worker {
		t.Fatalf("retry: %+v %v, want another worker", second, err)
	}
	g2.Settle(response.Result{Outcome: response.OutcomeOK}, 0)
	second.Ticket.Done(200, response.Usage{}, time.Time{})
	if n := a.queue.q.Counter("t"); n != prompt {
		t.Fatalf("served once after a retry: VTC counter = %v, want one prompt (%v)", n, prompt)
	}
	var fq FairQueue // Refund never goes below 0 and leaves unknown tenants alone
	fq.counter = map[string]float64{"x": 3}
	fq.Refund("x", 5)
	fq.Refund("y", 1)
	if fq.counter["x"] != 0 || len(fq.counter) != 1 {
		t.Fatalf("Refund: %v, want x at 0 and no y", fq.counter)
	}
}

// A class's queue_limit holds while a popped entry is being tried: the request that
// is picking (outside the queue's lock) keeps its place, so an arrival meanwhile is
// refused queue_full instead of taking it, and the tried entry given back
// (router.ErrWait) leaves the class at its limit. Before the fix the arrival was
// queued and the given-back entry made the class 2 deep with queue_limit 1.
func TestQueueLimitHoldsWhileAnEntryIsTried(t *testing.T) {
	cls := config.Class{Name: "batch", QueueLimit: 1, MaxQueueTime: time.Hour}
	cfg := config.Default().Admission
	cfg.Classes = []config.Class{cls}
	q := NewQueue(cfg, metrics.NewUnregistered().Admission, true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	entered, release := make(chan struct{}), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		first := true
		_, err := q.wait(ctx, "x", &cls, func() (*router.Ticket, error) {
			if first {
				first = false
				close(entered)
				<-release
			}
			return nil, router.ErrWait
		})
		aDone <- err
	}()
	<-entered // A was popped and is picking: the class has 0 waiting, 1 held
	bDone := make(chan error, 1)
	go func() {
		_, err := q.wait(ctx, "y", &cls, func() (*router.Ticket, error) { return nil, router.ErrWait })
		bDone <- err
	}()
	var bErr error
	for done := false; !done; {
		select {
		case bErr = <-bDone:
			done = true
		default:
			if q.Depths(cfg.Classes)["batch"] == 1 { // B was queued: the defect
				done = true
			}
			time.Sleep(time.Millisecond)
		}
	}
	close(release) // A gets ErrWait and is given back
	for q.Depths(cfg.Classes)["batch"] == 0 {
		time.Sleep(time.Millisecond)
	}
	if d := q.Depths(cfg.Classes)["batch"]; d != 1 {
		t.Fatalf("class depth %d after the tried entry was given back, want its queue_limit 1", d)
	}
	var re *queueRefusal
	if !errors.As(bErr, &re) || re.reason != ReasonQueueFull {
		t.Fatalf("arrival while the class's one entry was tried: %v, want %s", bErr, ReasonQueueFull)
	}
	cancel()
	if err := <-aDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("A: %v, want context.Canceled", err)
	}
}

// Hold counts a popped entry against its class's limit and the queue's size until it
// is given back or released.
func TestFairQueueHoldCountsAgainstLimits(t *testing.T) {
	q := NewFairQueue(2, map[string]int{"c": 1, "d": 5}, true)
	a := push(t, q, "x", "c", 0, 0)
	if e := q.Pop(); e != a {
		t.Fatalf("pop %v", e)
	}
	q.Hold(a)
	if _, r := q.Push(&Entry{Tenant: "y", Class: "c"}, time.Unix(1, 0)); r != ReasonQueueFull {
		t.Fatalf("class c with its one entry held: reason %q, want %s", r, ReasonQueueFull)
	}
	push(t, q, "y", "d", 0, time.Second)
	if _, r := q.Push(&Entry{Tenant: "z", Class: "d"}, time.Unix(2, 0)); r != ReasonQueueFull {
		t.Fatalf("queue of 2 with 1 waiting + 1 held: reason %q, want %s", r, ReasonQueueFull)
	}
	q.Refuse(a) // given back: 2 waiting, nothing held
	if q.Len() != 2 || q.Depth("c") != 1 {
		t.Fatalf("len %d depth(c) %d, want 2 and 1", q.Len(), q.Depth("c"))
	}
	e := q.Pop()
	q.Hold(e)
	q.Release(e) // dispatched: its place is free
	if _, r := q.Push(&Entry{Tenant: "w", Class: e.Class}, time.Unix(3, 0)); r != "" {
		t.Fatalf("after Release: reason %q, want admitted", r)
	}
}
