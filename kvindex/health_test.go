package kvindex

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex/kvevents"
)

// A publisher whose every BlockStored names a parent the index never saw (as
// llm-d-inference-sim's array format did before parent 0 was read as "no parent"):
// the worker's events arrive, none applies, so it must not claim exact, and says why
// once; the first event that applies makes it exact again.
func TestFailingStoredEventsLeaveExact(t *testing.T) {
	var log bytes.Buffer
	ix, _ := newTestIndex(t, func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(&log, nil)) })
	addWorkers(ix, "a")
	for i := 0; i < FailingAfter-1; i++ {
		apply(t, ix, "a", 0, stored([]uint64{uint64(100 + i)}, u(7), toks(i*bs, 1)))
	}
	if m := ix.Mode("a"); m != ModeExact {
		t.Fatalf("after %d failed events mode %v, want exact (a few unknown parents are routine)", FailingAfter-1, m)
	}
	for i := 0; i < 3; i++ { // past the threshold, and more: logged once
		apply(t, ix, "a", 0, stored([]uint64{uint64(200 + i)}, u(7), toks(i*bs, 1)))
	}
	if m := ix.Mode("a"); m != ModeApproximate {
		t.Fatalf("after %d failed events mode %v, want approximate", FailingAfter+2, m)
	}
	if s, _ := ix.Summary("a"); !s.Failing {
		t.Fatalf("summary does not say failing: %+v", s)
	}
	out := log.String()
	if n := strings.Count(out, "keep failing to apply"); n != 1 {
		t.Fatalf("failure logged %d times, want once:\n%s", n, out)
	}
	for _, want := range []string{"worker=a", "anomaly=unknown_parent", "parent", DocsNoEvents} {
		if !strings.Contains(out, want) {
			t.Fatalf("log lacks %q:\n%s", want, out)
		}
	}
	apply(t, ix, "a", 0, stored([]uint64{1}, nil, toks(1, 1)))
	if m := ix.Mode("a"); m != ModeExact {
		t.Fatalf("after an applied event mode %v, want exact", m)
	}
	// A failing run again is not logged again.
	for i := 0; i < FailingAfter; i++ {
		apply(t, ix, "a", 0, stored([]uint64{uint64(300 + i)}, u(8), toks(i*bs, 1)))
	}
	if m := ix.Mode("a"); m != ModeApproximate || strings.Count(log.String(), "keep failing to apply") != 1 {
		t.Fatalf("second failing run: mode %v, log:\n%s", m, log.String())
	}
}

// Bad events (fields that disagree) count as failures too; an interleaved event that
// applies resets the run.
func TestBadEventsCountAsFailures(t *testing.T) {
	ix, _ := newTestIndex(t)
	addWorkers(ix, "a")
	bad := stored([]uint64{1, 2}, nil, toks(1, 1)) // two hashes, one block of tokens
	bad.Err = kvevents.ErrMalformed
	for i := 0; i < FailingAfter+1; i++ {
		if err := ix.ApplyBatch("a", 0, &kvevents.Batch{Events: []kvevents.Event{bad}}); err != nil {
			t.Fatal(err)
		}
		if i == FailingAfter/2 {
			apply(t, ix, "a", 0, stored([]uint64{uint64(50 + i)}, nil, toks(i*bs, 1)))
		}
	}
	if m := ix.Mode("a"); m != ModeExact {
		t.Fatalf("a run broken by an applied event: mode %v, want exact", m)
	}
	for i := 0; i < FailingAfter; i++ {
		_ = ix.ApplyBatch("a", 0, &kvevents.Batch{Events: []kvevents.Event{bad}})
	}
	if m := ix.Mode("a"); m != ModeApproximate {
		t.Fatalf("after %d bad events mode %v, want approximate", FailingAfter, m)
	}
}

// Silent measures traffic without events: from the first booking after the last batch;
// a batch stops it; a worker without events is never silent.
func TestSilentAndLastEvent(t *testing.T) {
	for _, ttl := range []time.Duration{10 * time.Second, 0} { // bookings count with speculation off too
		ix, c := newTestIndex(t, func(o *Options) { o.SpeculativeTTL = ttl })
		addWorkers(ix, "a")
		ix.SetWorker(WorkerInfo{Name: "quiet", Model: "m"}) // expects no events
		keys := keysOf("m", toks(1, 2))
		if _, ok := ix.Silent("a"); ok {
			t.Fatal("silent before any traffic")
		}
		if _, ok := ix.LastEvent("a"); ok {
			t.Fatal("last event before any")
		}
		ix.Book("a", keys)
		ix.Book("quiet", keys)
		c.Add(40 * time.Second)
		ix.Book("a", keys) // later bookings do not restart the clock
		c.Add(30 * time.Second)
		if d, ok := ix.Silent("a"); !ok || d != 70*time.Second {
			t.Fatalf("ttl %v: silent %v %v, want 70s", ttl, d, ok)
		}
		if _, ok := ix.Silent("quiet"); ok {
			t.Fatal("a worker without events reported silent")
		}
		apply(t, ix, "a", 0, stored([]uint64{1}, nil, toks(1, 1)))
		if _, ok := ix.Silent("a"); ok {
			t.Fatal("silent right after an event")
		}
		c.Add(5 * time.Second)
		if at, ok := ix.LastEvent("a"); !ok || c.Now().Sub(at) != 5*time.Second {
			t.Fatalf("last event %v %v", at, ok)
		}
		if s, _ := ix.Summary("a"); s.LastEventAge == nil || *s.LastEventAge != 5 {
			t.Fatalf("summary last_event_age_s %v, want 5", s.LastEventAge)
		}
		ix.Book("a", keys)
		c.Add(time.Second)
		if d, ok := ix.Silent("a"); !ok || d != time.Second {
			t.Fatalf("silent after a new booking %v %v, want 1s", d, ok)
		}
	}
}
