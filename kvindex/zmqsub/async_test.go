package zmqsub

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/kvindex/kvevents"
	"github.com/kvroute/kvroute/kvindex/kvtest"
)

// Issue 11 item 3: replays are asynchronous. These tests hold each replay's answer on
// a channel (kvtest.Options.ReplayGate) and end exchanges on command
// (Manager.expireReplays), so nothing depends on how fast the machine is.

// gated is a worker "a" whose publisher answers replays only when the test says so.
type gated struct {
	*harness
	p    *kvtest.Publisher
	gate chan struct{} // one value: the publisher answers the replay request it holds
	reqs chan uint64   // requested seqs, as the publisher reads them
}

func newGated(t *testing.T, opts ...func(*Options)) *gated {
	t.Helper()
	g := &gated{gate: make(chan struct{}), reqs: make(chan uint64, 16)}
	g.harness = newHarness(t, opts...)
	g.mgr.expireReplays = make(chan struct{}) // before any exchange starts
	g.p = newPublisher(t, kvtest.Options{ReplayGate: g.gate, ReplayRequests: g.reqs})
	g.addWorkers(workerFor("a", g.p))
	// connected: the first frame seen may be above 0 (slow joiner) and start a catch-up
	// replay that waits for the gate; answer it
	g.eventually(func() bool {
		if s, ok := g.ix.Summary("a"); ok && s.Batches > 0 && g.pendingN() == 0 {
			return true
		}
		select {
		case <-g.reqs:
			g.gate <- struct{}{}
		default:
			_, _ = g.p.Publish(&kvevents.Batch{TS: 1, HasDPRank: true})
		}
		return false
	}, "worker a never received a batch")
	return g
}

func (g *gated) pendingN() float64 {
	return testutil.ToFloat64(g.ms.ReplaysPending.WithLabelValues("a"))
}
func (g *gated) buffered() float64 {
	return testutil.ToFloat64(g.ms.ReplayBufferedFrames.WithLabelValues("a"))
}
func (g *gated) replays(res string) float64 {
	return testutil.ToFloat64(g.ms.Replays.WithLabelValues("a", res))
}
func (g *gated) anomaly(kind string) float64 {
	return testutil.ToFloat64(g.ms.Anomalies.WithLabelValues("a", kind))
}

// pendingGap loses one batch (block 0: tokens 0..3, engine hash 1) and publishes the
// next (block 1: tokens 4..7, hash 2, parent 1): a gap whose replay request the
// publisher has read and holds. Block 1 cannot be applied before block 0.
func (g *gated) pendingGap() {
	g.t.Helper()
	pl, _ := kvevents.Encode(storedBatch(0, 1, 1, nil))
	_, _ = g.p.PublishRaw(pl, false)
	_, _ = g.p.Publish(storedBatch(bs, 1, 2, u(1)))
	g.eventually(func() bool { return g.pendingN() == 1 && g.buffered() == 1 }, "gap replay not pending with its trigger buffered")
	<-g.reqs
}

// Live events published while a replay is pending are buffered (the consumer keeps
// draining), then applied in seq order after the replayed range: the index is exactly
// what an in-order run gives. Before, the consumer waited for the replay and the
// events queued behind it.
func TestPendingReplayAppliesLiveFramesInOrder(t *testing.T) {
	g := newGated(t)
	ok0 := g.replays("ok")
	g.pendingGap()
	_, _ = g.p.Publish(storedBatch(2*bs, 1, 3, u(2))) // block 2, child of block 1
	_, _ = g.p.Publish(removedBatch(2))               // block 1 evicted
	_, _ = g.p.Publish(storedBatch(bs, 1, 4, u(1)))   // block 1 stored again (new hash)
	g.eventually(func() bool { return g.buffered() == 4 }, "live frames not buffered while the replay is pending: %v", g.buffered())
	if n := g.held("a", toks(0, 3)); n != 0 {
		t.Fatalf("%d blocks applied before the replay answered", n)
	}
	g.gate <- struct{}{} // the replay answers: block 0 (and the trigger, a duplicate)
	// the gauges drop when the buffer is released, just before it is applied
	g.eventually(func() bool { return g.pendingN() == 0 && g.held("a", toks(0, 3)) == 3 }, "replay never finished: holds %d of blocks 0..2, want 3", g.held("a", toks(0, 3)))
	if n := g.ix.Entries(); n != 3 {
		t.Fatalf("%d entries, want 3 (blocks 0, 1, 2)", n)
	}
	for _, k := range []string{"unknown_parent", "unknown_removed"} {
		if n := g.anomaly(k); n != 0 {
			t.Fatalf("anomalies{%s} = %v: frames applied out of order", k, n)
		}
	}
	if n := g.replays("ok") - ok0; n != 1 {
		t.Fatalf("ok replays +%v, want 1", n)
	}
	if m := g.ix.Mode("a"); m != kvindex.ModeExact {
		t.Fatalf("mode %v, want exact", m)
	}
	if n := testutil.ToFloat64(g.ms.ReplayBufferedBytes.WithLabelValues("a")); n != 0 {
		t.Fatalf("buffered bytes %v after the flush", n)
	}
}

// During a pending replay the live path keeps draining: many more frames than the
// SUB socket's high-water mark (1000) and the worker's queue (64) are received,
// buffered and applied, none dropped. The test publishes in chunks and waits for each
// chunk to be buffered, so a slow machine cannot make the publisher drop.
func TestPendingReplayKeepsDraining(t *testing.T) {
	g := newGated(t, func(o *Options) { o.QueueSize = 64; o.ReplayBufferFrames = 10000 })
	g.pendingGap()
	const n, chunk = 3000, 50 // a chunk fits the queue: a slow consumer cannot make it drop
	for i := 0; i < n; i++ {
		_, _ = g.p.Publish(storedBatch(1000+i*bs, 1, uint64(100+i), nil))
		if (i+1)%chunk == 0 {
			want := float64(i + 2) // + the trigger
			g.eventually(func() bool { return g.buffered() == want }, "buffered %v frames, want %v: the live path stopped draining", g.buffered(), want)
		}
	}
	g.gate <- struct{}{}
	g.eventually(func() bool { return g.pendingN() == 0 && g.held("a", toks(1000+(n-1)*bs, 1)) == 1 }, "replay never finished")
	for i := 0; i < n; i++ {
		if g.held("a", toks(1000+i*bs, 1)) != 1 {
			t.Fatalf("live frame %d lost", i)
		}
	}
	if g.held("a", toks(0, 2)) != 2 {
		t.Fatal("replayed block 0 or the trigger not applied")
	}
	if d := testutil.ToFloat64(g.ms.QueueDrops.WithLabelValues("a")); d != 0 {
		t.Fatalf("queue drops %v", d)
	}
	if o := testutil.ToFloat64(g.ms.ReplayBufferOverflows.WithLabelValues("a")); o != 0 {
		t.Fatalf("overflows %v", o)
	}
	if m := g.ix.Mode("a"); m != kvindex.ModeExact {
		t.Fatalf("mode %v, want exact", m)
	}
}

// A replay that times out while live frames are buffered: the buffered frames are
// applied (in order), the failure is counted and the worker goes approximate, as after
// a failed replay before.
func TestReplayTimeoutAppliesBufferedFrames(t *testing.T) {
	g := newGated(t)
	failed0 := g.replays("failed")
	g.pendingGap()
	for i := 0; i < 3; i++ {
		_, _ = g.p.Publish(storedBatch(100+i*bs, 1, uint64(10+i), nil))
	}
	g.eventually(func() bool { return g.buffered() == 4 }, "live frames not buffered")
	g.mgr.expireReplays <- struct{}{} // the pending exchange times out now
	g.eventually(func() bool { return g.pendingN() == 0 && g.held("a", toks(100+2*bs, 1)) == 1 }, "timed-out replay still pending")
	for i := 0; i < 3; i++ {
		if g.held("a", toks(100+i*bs, 1)) != 1 {
			t.Fatalf("buffered frame %d not applied after the timeout", i)
		}
	}
	if n := g.replays("failed") - failed0; n != 1 {
		t.Fatalf("failed replays +%v, want 1", n)
	}
	// the trigger's parent was never replayed: counted, not indexed
	if g.anomaly("unknown_parent") != 1 || g.held("a", toks(0, 2)) != 0 {
		t.Fatalf("trigger: unknown_parent %v, held %d", g.anomaly("unknown_parent"), g.held("a", toks(0, 2)))
	}
	if m := g.ix.Mode("a"); m != kvindex.ModeApproximate {
		t.Fatalf("mode %v, want approximate after a failed replay", m)
	}
	if d := testutil.ToFloat64(g.ms.ReplayBufferDiscarded.WithLabelValues("a")); d != 0 {
		t.Fatalf("%v buffered frames discarded", d)
	}
}

// A reorder buffer that fills abandons the replay: everything buffered and the frame
// that did not fit are applied, the overflow counted, the worker approximate. The
// replay's late answer is ignored.
func TestReorderBufferOverflow(t *testing.T) {
	g := newGated(t, func(o *Options) { o.ReplayBufferFrames = 4 })
	g.pendingGap()
	for i := 0; i < 4; i++ { // the 4th does not fit
		_, _ = g.p.Publish(storedBatch(100+i*bs, 1, uint64(10+i), nil))
	}
	g.eventually(func() bool {
		return testutil.ToFloat64(g.ms.ReplayBufferOverflows.WithLabelValues("a")) == 1 && g.pendingN() == 0 && g.held("a", toks(100+3*bs, 1)) == 1
	}, "no overflow")
	for i := 0; i < 4; i++ {
		if g.held("a", toks(100+i*bs, 1)) != 1 {
			t.Fatalf("live frame %d not applied after the overflow", i)
		}
	}
	if n := g.replays("abandoned"); n != 1 {
		t.Fatalf("abandoned replays %v, want 1", n)
	}
	if m := g.ix.Mode("a"); m != kvindex.ModeApproximate {
		t.Fatalf("mode %v, want approximate", m)
	}
	g.gate <- struct{}{} // the late answer (block 0) goes to a closed socket
	_, _ = g.p.Publish(storedBatch(900, 1, 90, nil))
	g.eventually(func() bool { return g.held("a", toks(900, 1)) == 1 }, "later frame not applied")
	if g.held("a", toks(0, 1)) != 0 {
		t.Fatal("an abandoned replay's answer was applied")
	}
}

// A publisher that restarts while a replay is pending (its seq goes back) is a
// restart: counted, the old engine's entries and buffered frames dropped (counted),
// the stale replay abandoned; the new engine's first frame is a baseline whose
// catch-up replay is applied. Before, the consumer could not even see the new frames
// until the replay ended.
func TestRestartDuringPendingReplay(t *testing.T) {
	g := newGated(t)
	_, _ = g.p.Publish(storedBatch(500, 2, 50, nil))
	g.eventually(func() bool { return g.held("a", toks(500, 2)) == 2 }, "old engine's blocks not stored")
	restarts0 := testutil.ToFloat64(g.ms.Restarts.WithLabelValues("a"))
	g.pendingGap()
	_, _ = g.p.Publish(storedBatch(100, 1, 10, nil))
	_, _ = g.p.Publish(storedBatch(200, 1, 11, nil))
	g.eventually(func() bool { return g.buffered() == 3 }, "live frames not buffered")

	g.p.Restart() // new engine: seq 0 lost, seq 1 seen first
	pl, _ := kvevents.Encode(storedBatch(600, 1, 1, nil))
	_, _ = g.p.PublishRaw(pl, false)
	_, _ = g.p.Publish(storedBatch(700, 1, 2, nil))
	g.eventually(func() bool { return testutil.ToFloat64(g.ms.Restarts.WithLabelValues("a")) == restarts0+1 },
		"restart not detected while a replay was pending")
	if g.held("a", toks(500, 2)) != 0 {
		t.Fatal("old engine's entries kept after the restart")
	}
	if d := testutil.ToFloat64(g.ms.ReplayBufferDiscarded.WithLabelValues("a")); d != 3 {
		t.Fatalf("discarded %v buffered frames, want 3", d)
	}
	if n := g.replays("abandoned"); n != 1 {
		t.Fatalf("abandoned replays %v, want 1", n)
	}
	// the new engine's first frame (seq 1) waits for its catch-up replay from 0
	g.eventually(func() bool { return g.pendingN() == 1 && g.buffered() == 1 }, "catch-up of the new engine not pending")
	g.gate <- struct{}{} // the old request's answer: to the closed socket of the abandoned exchange
	if from := <-g.reqs; from != 0 {
		t.Fatalf("catch-up requested from %d, want 0", from)
	}
	g.gate <- struct{}{} // the catch-up's answer: seq 0 and 1
	g.eventually(func() bool { return g.pendingN() == 0 && g.held("a", toks(700, 1)) == 1 }, "catch-up never finished")
	if g.held("a", toks(600, 1)) != 1 || g.held("a", toks(700, 1)) != 1 {
		t.Fatalf("new engine's blocks: seq 0 %d, seq 1 %d, want 1 and 1", g.held("a", toks(600, 1)), g.held("a", toks(700, 1)))
	}
	for _, tk := range [][]uint32{toks(0, 1), toks(100, 1), toks(200, 1)} {
		if g.held("a", tk) != 0 {
			t.Fatalf("old engine's block %v indexed after the restart", tk[:1])
		}
	}
	if n := g.ix.Entries(); n != 2 {
		t.Fatalf("%d entries, want 2", n)
	}
	if m := g.ix.Mode("a"); m != kvindex.ModeExact {
		t.Fatalf("mode %v, want exact: the new engine's first frame is a baseline", m)
	}
}
