package admission

import (
	"fmt"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 4, 10, 0, 30, 0, time.UTC)

func push(t *testing.T, q *FairQueue, tenant, class string, prio int, at time.Duration) *Entry {
	t.Helper()
	e := &Entry{Tenant: tenant, Class: class, Priority: prio, Deadline: t0.Add(at + time.Minute), Tag: fmt.Sprintf("%s@%s", tenant, at)}
	if shed, reason := q.Push(e, t0.Add(at)); reason != "" || shed != nil {
		t.Fatalf("push %v: shed %v reason %q", e.Tag, shed, reason)
	}
	return e
}

// A tenant flooding the queue does not delay a light tenant behind its backlog: with
// VTC the light tenant's requests are dispatched as soon as its counter is the
// smallest; FCFS serves the flood's backlog first.
func TestFairQueueVTCFloodVersusLight(t *testing.T) {
	order := func(fair bool) []string {
		q := NewFairQueue(100, map[string]int{"c": 100}, fair)
		for i := 0; i < 10; i++ {
			push(t, q, "flood", "c", 0, time.Duration(i)*time.Millisecond)
		}
		for i := 0; i < 3; i++ {
			push(t, q, "light", "c", 0, time.Duration(10+i)*time.Millisecond)
		}
		var out []string
		for e := q.Pop(); e != nil; e = q.Pop() {
			q.Charge(e.Tenant, 100) // each request is served 100 tokens
			out = append(out, e.Tenant)
		}
		return out
	}
	got := fmt.Sprint(order(true))
	// both start at counter 0 (light lifted to the flood's 0): flood's earlier arrival first,
	// then alternation while light has requests.
	if want := "[flood light flood light flood light flood flood flood flood flood flood flood]"; got != want {
		t.Fatalf("VTC order\n got %s\nwant %s", got, want)
	}
	if got, want := fmt.Sprint(order(false)), "[flood flood flood flood flood flood flood flood flood flood light light light]"; got != want {
		t.Fatalf("FCFS order\n got %s\nwant %s", got, want)
	}
}

// A tenant that was served a lot while another was idle keeps its debt, and a tenant
// arriving after idling is lifted to the floor: it banks no credit for the idle time.
func TestFairQueueCounterLift(t *testing.T) {
	q := NewFairQueue(100, map[string]int{"c": 100}, true)
	q.Charge("heavy", 10_000)
	push(t, q, "heavy", "c", 0, 0)
	push(t, q, "new", "c", 0, time.Millisecond) // lifted to heavy's 10,000
	if c := q.Counter("new"); c != 10_000 {
		t.Fatalf("new tenant's counter %v, want lifted to 10000", c)
	}
	if e := q.Pop(); e.Tenant != "heavy" { // equal counters: FCFS
		t.Fatalf("popped %s", e.Tenant)
	}
	q.Charge("heavy", 500)
	push(t, q, "heavy", "c", 0, 2*time.Millisecond)
	if e := q.Pop(); e.Tenant != "new" {
		t.Fatalf("popped %s, want new (smaller counter)", e.Tenant)
	}
}

// Higher priority is dispatched first whatever the counters; a full queue sheds the
// latest arrival of the lowest band below the arrival's, and refuses an arrival with
// nothing lower to shed; a full class refuses its own arrivals.
func TestFairQueuePriorityAndShedding(t *testing.T) {
	q := NewFairQueue(3, map[string]int{"batch": 3, "interactive": 3, "small": 1}, true)
	q.Charge("b", 1e6) // priority beats counters
	low1 := push(t, q, "a", "batch", 0, 0)
	low2 := push(t, q, "a", "batch", 0, time.Millisecond)
	hi := push(t, q, "b", "interactive", 10, 2*time.Millisecond)
	// full: an interactive arrival sheds the latest batch entry
	hi2 := &Entry{Tenant: "c", Class: "interactive", Priority: 10}
	shed, reason := q.Push(hi2, t0.Add(3*time.Millisecond))
	if reason != "" || shed != low2 {
		t.Fatalf("shed %v reason %q, want the latest batch entry", shed, reason)
	}
	// full, and a batch arrival has nothing lower to shed
	if shed, reason := q.Push(&Entry{Tenant: "a", Class: "batch"}, t0); shed != nil || reason != ReasonQueueFull {
		t.Fatalf("batch arrival into a full queue: shed %v reason %q", shed, reason)
	}
	if got := q.Depths(); got["batch"] != 1 || got["interactive"] != 2 || q.Len() != 3 {
		t.Fatalf("depths %v len %d", got, q.Len())
	}
	// within the interactive band VTC decides: c (lifted to the floor, 0) before b (10⁶)
	if e := q.Pop(); e != hi2 {
		t.Fatalf("first pop %v, want c's interactive entry", e)
	}
	if e := q.Pop(); e != hi {
		t.Fatalf("second pop %v", e)
	}
	if e := q.Pop(); e != low1 {
		t.Fatalf("third pop %v", e.Tag)
	}
	if q.Pop() != nil || q.Len() != 0 {
		t.Fatal("queue not empty")
	}
	// per-class limit; a class without a limit may not wait
	push(t, q, "a", "small", 0, 0)
	if _, reason := q.Push(&Entry{Tenant: "b", Class: "small"}, t0); reason != ReasonQueueFull {
		t.Fatalf("small class over its limit: %q", reason)
	}
	if _, reason := q.Push(&Entry{Tenant: "b", Class: "unknown"}, t0); reason != ReasonQueueFull {
		t.Fatalf("class without a queue: %q", reason)
	}
}

// Expire refuses exactly the entries at or past their deadline; Requeue keeps the
// arrival order; Remove (client gone) takes one out.
func TestFairQueueExpireRequeueRemove(t *testing.T) {
	q := NewFairQueue(10, map[string]int{"c": 10}, true)
	a := &Entry{Tenant: "x", Class: "c", Deadline: t0.Add(time.Second)}
	b := &Entry{Tenant: "x", Class: "c", Deadline: t0.Add(3 * time.Second)}
	c := &Entry{Tenant: "y", Class: "c", Deadline: t0.Add(2 * time.Second)}
	for _, e := range []*Entry{a, b, c} {
		q.Push(e, t0)
	}
	if d, ok := q.NextDeadline(); !ok || !d.Equal(t0.Add(time.Second)) {
		t.Fatalf("next deadline %v %v", d, ok)
	}
	if got := q.Expire(t0.Add(999 * time.Millisecond)); len(got) != 0 {
		t.Fatalf("expired early: %d", len(got))
	}
	if got := q.Expire(t0.Add(time.Second)); len(got) != 1 || got[0] != a {
		t.Fatalf("expired %v", got)
	}
	e := q.Pop()
	if e != b && e != c {
		t.Fatalf("pop %v", e)
	}
	q.Requeue(e)
	if q.Len() != 2 || q.Depth("c") != 2 {
		t.Fatalf("len %d after requeue", q.Len())
	}
	if !q.Remove(c) || q.Remove(c) || q.Len() != 1 {
		t.Fatal("remove")
	}
	if got := q.Pop(); got != b {
		t.Fatalf("pop %v", got)
	}
}

// Counters stay bounded however many tenants are charged.
func TestFairQueueCountersBounded(t *testing.T) {
	q := NewFairQueue(10, map[string]int{"c": 10}, true)
	for i := 0; i < 3*maxCounters; i++ {
		q.Charge(fmt.Sprint("t", i), 1)
	}
	if n := len(q.counter); n > maxCounters {
		t.Fatalf("%d counters", n)
	}
}

// Head-of-line: a round tries the entries behind one the router told to wait (its
// preferred worker saturated, another model), in order, up to the scan; a refused
// entry keeps its place and comes first again in the next round.
func TestFairQueueRoundSkipsRefusedHead(t *testing.T) {
	q := NewFairQueue(100, map[string]int{"c": 100}, false)
	q.SetScan(2)
	var es []*Entry
	for i := 0; i < 5; i++ {
		es = append(es, push(t, q, "x", "c", 0, time.Duration(i)*time.Millisecond))
	}
	// the router places only entries 2 and 4 (their workers have room)
	fits := map[*Entry]bool{es[2]: true, es[4]: true}
	var got []any
	for e := q.Pop(); e != nil; e = q.Pop() {
		if fits[e] {
			got = append(got, e.Tag)
		} else {
			q.Refuse(e)
		}
	}
	// 0 refused, 1 refused: the scan (2) is spent before 2 is reached
	if len(got) != 0 || q.Len() != 5 {
		t.Fatalf("scan 2: dispatched %v, %d waiting", got, q.Len())
	}
	q.SetScan(DefaultScan)
	q.Round()
	for e := q.Pop(); e != nil; e = q.Pop() {
		if fits[e] {
			got = append(got, e.Tag)
		} else {
			q.Refuse(e)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint([]any{es[2].Tag, es[4].Tag}) || q.Len() != 3 {
		t.Fatalf("round: dispatched %v, %d waiting; want entries 2 and 4", got, q.Len())
	}
	// refused entries keep their order: the next round starts at entry 0
	q.Round()
	if e := q.Pop(); e != es[0] {
		t.Fatalf("next round's first %v, want %v", e.Tag, es[0].Tag)
	}
}
