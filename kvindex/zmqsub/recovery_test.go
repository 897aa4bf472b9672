package zmqsub

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/kvindex/kvevents"
	"github.com/kvroute/kvroute/kvindex/kvtest"
	"github.com/kvroute/kvroute/workers"
)

// joinLate buffers n batches the subscriber never sees (published before it joined),
// then publishes empty batches until one is applied: the first frame the subscriber
// sees has seq ≥ n, and a catch-up replay fetches the buffered ones.
func (h *harness) joinLate(worker string, p *kvtest.Publisher, n int) {
	h.t.Helper()
	for i := 0; i < n; i++ {
		pl, _ := kvevents.Encode(storedBatch(5000+i*10, 1, uint64(900+i), nil))
		_, _ = p.PublishRaw(pl, false)
	}
	h.connected(worker, p)
}

// Issue 11 item 1: after a replay that covered the frame that triggered it, a
// restarted engine publishing from seq 0 again is a restart: counted, old blocks gone,
// new blocks indexed. The duplicate floor used to be the replay's start, so after a
// replay from 0 (a restart's, or the start-up catch-up) every seq of the next engine
// below the old next was taken for a duplicate and dropped.
func TestRestartAfterReplayCoveringTrigger(t *testing.T) {
	h := newHarness(t)
	p := newPublisher(t, kvtest.Options{})
	h.addWorkers(workerFor("a", p))
	h.connected("a", p)
	for i := 0; i < 10; i++ { // the old engine's seq well above the new one's 0..2
		_, _ = p.Publish(&kvevents.Batch{TS: 1, HasDPRank: true})
	}
	_, _ = p.Publish(storedBatch(0, 2, 1, nil))
	h.eventually(func() bool { return h.held("a", toks(0, 2)) == 2 }, "blocks not stored")

	// Restart 1: the new engine's seq 0 and 1 are lost, seq 2 arrives: restart, then a
	// replay from 0 that covers the trigger (seq 2).
	p.Restart()
	for i := 0; i < 2; i++ {
		pl, _ := kvevents.Encode(storedBatch(100+10*i, 1, uint64(10+i), nil))
		_, _ = p.PublishRaw(pl, false)
	}
	_, _ = p.Publish(storedBatch(200, 1, 1, nil))
	h.eventually(func() bool { return h.held("a", toks(200, 1)) == 1 }, "restart 1: trigger not applied")
	h.eventually(func() bool { return h.held("a", toks(100, 1)) == 1 && h.held("a", toks(0, 2)) == 0 },
		"restart 1: replay not applied or old blocks kept")

	// Restart 2, right after: seq 0 from a new engine, hash 1 with other content.
	p.Restart()
	_, _ = p.Publish(storedBatch(700, 1, 1, nil))
	h.eventually(func() bool { return h.held("a", toks(700, 1)) == 1 }, "restart 2: new block not indexed (taken for a duplicate)")
	if got := h.held("a", toks(200, 1)) + h.held("a", toks(100, 1)); got != 0 {
		t.Fatalf("restart 2: previous engine's blocks still held: %d", got)
	}
	if n := testutil.ToFloat64(h.ms.Restarts.WithLabelValues("a")); n != 2 {
		t.Fatalf("restarts = %v, want 2", n)
	}
}

// Issue 11 item 2: a replay that starts below the requested seq (already-applied
// batches resent) is an overlap, not a hole: skip what was applied, stay exact.
func TestOverlappingReplayStaysExact(t *testing.T) {
	h := newHarness(t)
	p := newPublisher(t, kvtest.Options{ReplayOverlap: 2})
	h.addWorkers(workerFor("a", p))
	h.connected("a", p)
	_, _ = p.Publish(storedBatch(0, 1, 1, nil))
	h.eventually(func() bool { return h.held("a", toks(0, 1)) == 1 }, "first batch not applied")
	_, _ = p.Publish(removedBatch(1)) // resent by the overlapping replay: must not be applied twice
	h.eventually(func() bool { return h.held("a", toks(0, 1)) == 0 }, "removal not applied")
	pl, _ := kvevents.Encode(storedBatch(100, 1, 2, nil))
	_, _ = p.PublishRaw(pl, false) // lost: the gap
	_, _ = p.Publish(storedBatch(200, 1, 3, nil))
	h.eventually(func() bool { return testutil.ToFloat64(h.ms.Replays.WithLabelValues("a", "ok")) >= 1 }, "no ok replay (partial: %v)",
		testutil.ToFloat64(h.ms.Replays.WithLabelValues("a", "partial")))
	h.eventually(func() bool { return h.held("a", toks(200, 1)) == 1 }, "live batch not applied")
	if h.held("a", toks(100, 1)) != 1 {
		t.Fatal("replayed batch not applied")
	}
	if m := h.ix.Mode("a"); m != kvindex.ModeExact {
		t.Fatalf("mode %v after an overlapping replay, want exact", m)
	}
	if n := testutil.ToFloat64(h.ms.Anomalies.WithLabelValues("a", "unknown_removed")); n != 0 {
		t.Fatalf("overlap re-applied an old batch: unknown_removed = %v", n)
	}
}

// Issue 11 item 3: a replay socket that never answers costs one replay timeout, then
// the worker's replays back off; gaps inside the backoff are counted and the live
// events keep being applied.
func TestReplayBackoff(t *testing.T) {
	h := newHarness(t, func(o *Options) {
		o.ReplayTimeout = 300 * time.Millisecond
		o.ReplayBackoffMin = time.Hour // every later gap falls inside the backoff, however slow the machine
	})
	p := newPublisher(t, kvtest.Options{ReplayMute: true})
	h.addWorkers(workerFor("a", p))
	h.connected("a", p)
	const gaps = 5
	for i := 0; i < gaps; i++ {
		pl, _ := kvevents.Encode(storedBatch(100*i, 1, uint64(10+i), nil))
		_, _ = p.PublishRaw(pl, false)
		_, _ = p.Publish(storedBatch(100*i+50, 1, uint64(20+i), nil))
	}
	h.eventually(func() bool { return h.held("a", toks(100*(gaps-1)+50, 1)) == 1 }, "live batches not applied")
	for i := 0; i < gaps; i++ {
		if h.held("a", toks(100*i+50, 1)) != 1 {
			t.Fatalf("live batch %d lost", i)
		}
	}
	if n := testutil.ToFloat64(h.ms.Replays.WithLabelValues("a", "failed")); n != 1 {
		t.Fatalf("failed replays = %v, want 1 (then backoff)", n)
	}
	// gaps-1, or gaps when the first frame seen already triggered the (failed) catch-up
	if n := testutil.ToFloat64(h.ms.ReplayBackoffs.WithLabelValues("a")); n < gaps-1 {
		t.Fatalf("replay backoffs = %v, want ≥ %d", n, gaps-1)
	}
	if h.ix.Mode("a") != kvindex.ModeApproximate {
		t.Fatal("gaps that were not replayed must leave the worker approximate")
	}
}

// Issue 11 item 7: the first frame seen from a publisher is a baseline. A publisher
// numbering from 1, with or without a replay socket, leaves the worker exact; one
// without a replay endpoint never gets a replay request.
func TestFirstFrameIsBaseline(t *testing.T) {
	for _, tc := range []struct {
		name   string
		replay string
	}{{"with replay", ""}, {"without replay", "-"}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			p := newPublisher(t, kvtest.Options{FirstSeq: 1, ReplayEndpoint: tc.replay})
			h.addWorkers(workerFor("a", p))
			h.connected("a", p)
			_, _ = p.Publish(storedBatch(0, 1, 1, nil))
			h.eventually(func() bool { return h.held("a", toks(0, 1)) == 1 }, "batch not applied")
			if m := h.ix.Mode("a"); m != kvindex.ModeExact {
				t.Fatalf("mode %v, want exact: the first frame is a baseline", m)
			}
			if n := testutil.ToFloat64(h.ms.Gaps.WithLabelValues("a")); n != 0 {
				t.Fatalf("gaps = %v", n)
			}
			failed := testutil.ToFloat64(h.ms.Replays.WithLabelValues("a", "failed"))
			if tc.replay == "-" && failed != 0 {
				t.Fatalf("a worker without a replay endpoint got %v replay attempts", failed)
			}
		})
	}
}

// Without a replay endpoint a gap is counted and the worker goes approximate, with no
// replay attempted.
func TestNoReplayEndpointGoesApproximate(t *testing.T) {
	h := newHarness(t)
	p := newPublisher(t, kvtest.Options{ReplayEndpoint: "-"})
	h.addWorkers(workerFor("a", p))
	h.connected("a", p)
	pl, _ := kvevents.Encode(storedBatch(0, 1, 1, nil))
	_, _ = p.PublishRaw(pl, false)
	_, _ = p.Publish(storedBatch(100, 1, 2, nil))
	h.eventually(func() bool { return h.held("a", toks(100, 1)) == 1 }, "live batch not applied")
	if n := testutil.ToFloat64(h.ms.Gaps.WithLabelValues("a")); n != 1 {
		t.Fatalf("gaps = %v, want 1", n)
	}
	if h.ix.Mode("a") != kvindex.ModeApproximate {
		t.Fatal("a worker whose gap cannot be replayed runs approximate")
	}
	for _, res := range []string{"ok", "partial", "failed"} {
		if n := testutil.ToFloat64(h.ms.Replays.WithLabelValues("a", res)); n != 0 {
			t.Fatalf("replays{%s} = %v without a replay endpoint", res, n)
		}
	}
}

// Issue 11 item 5: in bind mode all ranks of a worker share its topic; each batch goes
// to the rank its payload names (data_parallel_rank), in both batch wire formats.
func TestBindModeDPRankFromPayload(t *testing.T) {
	for _, enc := range []kvevents.EncodeOptions{{}, {BatchMap: true}, {Format: kvevents.FormatArray}} {
		h := newHarness(t, func(o *Options) { o.BindEndpoint = "tcp://127.0.0.1:*" })
		ep := h.mgr.BoundEndpoint(t.Context())
		var ps []*kvtest.Publisher
		for r := 0; r < 2; r++ {
			ps = append(ps, newPublisher(t, kvtest.Options{Endpoint: ep, Connect: true, Topic: "kv@10.0.0.1:8000@m", Encode: enc}))
		}
		h.addWorkers(&workers.Worker{Name: "dp", Address: "10.0.0.1:8000", Models: []string{"m"},
			KVEvents: workers.KVEvents{ReplayEndpoint: ps[0].ReplayEndpoint(), DPSize: 2}})
		for r, p := range ps {
			h.eventually(func() bool {
				b := storedBatch(r*1000, 1, 7, nil) // same engine hash on both ranks
				b.DPRank = r
				_, _ = p.Publish(b)
				time.Sleep(5 * time.Millisecond)
				return h.held("dp", toks(r*1000, 1)) == 1
			}, "rank %d never applied", r)
		}
		s, _ := h.ix.Summary("dp")
		if s.Ranks[0] != 1 || s.Ranks[1] != 1 {
			t.Fatalf("%+v: ranks %v, want one entry on each rank", enc, s.Ranks)
		}
	}
}

// Issue 11 item 6: a topic naming only the worker's IP is attributed when exactly one
// worker has that IP; an IP two workers share is counted and logged as an ambiguous
// host (issue 29), anything else as unmatched_topic.
func TestUnmatchedTopics(t *testing.T) {
	log := &lockedBuf{}
	h := newHarness(t, func(o *Options) {
		o.BindEndpoint = "tcp://127.0.0.1:*"
		o.Logger = slog.New(slog.NewTextHandler(log, nil))
	})
	ep := h.mgr.BoundEndpoint(t.Context())
	byIP := newPublisher(t, kvtest.Options{Endpoint: ep, Connect: true, Topic: "kv@10.0.0.1@m"})
	shared := newPublisher(t, kvtest.Options{Endpoint: ep, Connect: true, Topic: "kv@10.0.0.2@m"})
	stranger := newPublisher(t, kvtest.Options{Endpoint: ep, Connect: true, Topic: "kv@10.9.9.9:1@m"})
	h.addWorkers(
		&workers.Worker{Name: "a", Address: "10.0.0.1:8000", Models: []string{"m"}},
		&workers.Worker{Name: "b1", Address: "10.0.0.2:8000", Models: []string{"m"}},
		&workers.Worker{Name: "b2", Address: "10.0.0.2:8001", Models: []string{"m"}},
	)
	h.connected("a", byIP)
	for _, c := range []struct {
		p      *kvtest.Publisher
		reason string
	}{{shared, "ambiguous_host"}, {stranger, "unmatched_topic"}} {
		dropped := h.ms.DroppedMessages.WithLabelValues(c.reason)
		before := testutil.ToFloat64(dropped)
		h.eventually(func() bool {
			_, _ = c.p.Publish(storedBatch(0, 1, 1, nil))
			time.Sleep(5 * time.Millisecond)
			return testutil.ToFloat64(dropped) > before
		}, "%s never counted", c.reason)
	}
	for _, w := range []string{"b1", "b2"} {
		if s, _ := h.ix.Summary(w); s.Batches != 0 {
			t.Fatalf("%s got a message whose topic names an IP two workers share", w)
		}
	}
	out := log.String()
	for _, want := range []string{`topic names an ambiguous host`, `topic=kv@10.0.0.2@m`, `workers="[b1 b2]"`, "ip:port",
		`topic matches no worker`, `topic=kv@10.9.9.9:1@m`} {
		if !strings.Contains(out, want) {
			t.Fatalf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "matches no worker; messages dropped\" topic=kv@10.0.0.2") {
		t.Fatalf("the shared host is reported as matching no worker:\n%s", out)
	}
}

// Issue 10 item 1 through the real sockets: thousands of random frames (wrong part
// counts, bad seqs, random and mutated payloads), the 15-byte payload live and in a
// replay reply, and a message over the size cap. The consumer survives, counts what it
// dropped, and still applies the next good batch.
func TestHostileFramesThroughSUB(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.MaxMessageBytes = 64 << 10 })
	p := newPublisher(t, kvtest.Options{})
	h.addWorkers(workerFor("a", p))
	h.connected("a", p)
	attack, _ := hex.DecodeString("93cb3ff0000000000000dd0fffffff")

	// the attack payload live, then lost and replayed
	_, _ = p.PublishRaw(attack, true)
	_, _ = p.PublishRaw(attack, false)
	_, _ = p.Publish(storedBatch(0, 1, 1, nil))
	h.eventually(func() bool { return h.held("a", toks(0, 1)) == 1 }, "batch after the attack payloads not applied")
	if n := testutil.ToFloat64(h.ms.DecodeErrors.WithLabelValues("a")); n < 2 {
		t.Fatalf("decode errors %v, want ≥ 2 (live + replayed attack payload)", n)
	}

	// The flood goes in chunks well under the PUB's and SUB's high-water marks (libzmq
	// default 1000): unpaced, a busy machine dropped part of it before the decoder saw
	// it. Kinds 1–3 (seq not 8 bytes, 2 or 4 parts) are rejected by the receive loop
	// itself, so each is a decode error the moment it is received; after a chunk the
	// test waits until the counter holds all of them. Kinds 0 and 4 (a mutated valid
	// payload, random bytes) go on to the consumer and may decode or be skipped as
	// duplicates, so they are not counted on.
	const frames, chunk = 3000, 100
	base := testutil.ToFloat64(h.ms.DecodeErrors.WithLabelValues("a"))
	guaranteed := 0
	rng := rand.New(rand.NewPCG(7, 11))
	good, _ := kvevents.Encode(storedBatch(0, 2, 1, nil))
	for i := 0; i < frames; i++ {
		var parts [][]byte
		seq := make([]byte, 8)
		binary.BigEndian.PutUint64(seq, rng.Uint64()%64)
		payload := append([]byte{}, good...)
		for j := 0; j < 1+rng.IntN(3); j++ {
			payload[rng.IntN(len(payload))] = byte(rng.Uint32())
		}
		switch i % 5 {
		case 0:
			parts = [][]byte{[]byte(""), seq, payload}
		case 1:
			parts = [][]byte{[]byte(""), seq[:rng.IntN(8)], payload}
		case 2:
			parts = [][]byte{[]byte(""), seq}
		case 3:
			parts = [][]byte{[]byte(""), seq, payload, payload}
		case 4:
			rnd := make([]byte, rng.IntN(200))
			for j := range rnd {
				rnd[j] = byte(rng.Uint32())
			}
			parts = [][]byte{[]byte(""), seq, rnd}
		}
		if err := p.SendRaw(parts...); err != nil {
			t.Fatal(err)
		}
		if k := i % 5; k >= 1 && k <= 3 {
			guaranteed++
		}
		if (i+1)%chunk == 0 {
			want := base + float64(guaranteed)
			h.eventually(func() bool { return testutil.ToFloat64(h.ms.DecodeErrors.WithLabelValues("a")) >= want },
				"after %d frames: decode errors %v, want ≥ %v", i+1, lazy(func() string {
					return fmt.Sprint(testutil.ToFloat64(h.ms.DecodeErrors.WithLabelValues("a")))
				}), want)
		}
	}
	// over the 64 KiB cap: ZMQ drops the connection before reading it (resent until
	// seen: the PUB itself drops messages past its high-water mark after the flood)
	big := make([]byte, 1<<20)
	h.eventually(func() bool {
		_ = p.SendRaw([]byte(""), make([]byte, 8), big)
		time.Sleep(20 * time.Millisecond)
		return testutil.ToFloat64(h.ms.Disconnects.WithLabelValues("a")) >= 1
	}, "oversize message: no disconnect counted")

	// still alive: a restart (seq 0 from a fresh engine) and a good batch are applied
	p.Restart()
	h.eventually(func() bool {
		_, _ = p.Publish(storedBatch(3000, 1, 77, nil))
		time.Sleep(5 * time.Millisecond)
		return h.held("a", toks(3000, 1)) == 1
	}, "no good batch applied after the hostile frames %s", lazy(func() string { return h.diag("a") }))
	if n, want := testutil.ToFloat64(h.ms.DecodeErrors.WithLabelValues("a")), base+float64(guaranteed); n < want {
		t.Fatalf("decode errors %v, want ≥ %v: the malformed frames were not counted", n, want)
	}
}

// A message over MaxMessageBytes makes ZMQ close the SUB's connection as a protocol
// error, which libzmq does not reconnect: the subscription re-creates its socket, and
// live frames (no replay endpoint: nothing else could deliver them) are applied again.
// Before the fix the SUB stayed dead and this timed out.
func TestOversizeMessageSUBConnectsAgain(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.MaxMessageBytes = 64 << 10 })
	p := newPublisher(t, kvtest.Options{})
	w := workerFor("a", p)
	w.KVEvents.ReplayEndpoint = ""
	h.addWorkers(w)
	h.connected("a", p)
	big := make([]byte, 1<<20)
	h.eventually(func() bool {
		_ = p.SendRaw([]byte(""), make([]byte, 8), big)
		time.Sleep(20 * time.Millisecond)
		return testutil.ToFloat64(h.ms.Disconnects.WithLabelValues("a")) >= 1
	}, "oversize message: no disconnect counted")
	h.eventually(func() bool {
		_, _ = p.Publish(storedBatch(100, 1, 1, nil))
		time.Sleep(5 * time.Millisecond)
		return h.held("a", toks(100, 1)) == 1
	}, "no live batch applied after the oversize message %s", lazy(func() string { return h.diag("a") }))
	if n := testutil.ToFloat64(h.ms.Reconnects.WithLabelValues("a")); n < 1 {
		t.Fatalf("reconnects = %v, want ≥ 1 (the socket is re-created)", n)
	}
	// the reconnect is treated like any other (a possibly new engine): entries reset,
	// its next frame a baseline — so the worker stays exact
	if m := h.ix.Mode("a"); m != kvindex.ModeExact {
		t.Fatalf("mode %v, want exact %s", m, h.diag("a"))
	}
}

// Issue 10 item 15: a restarted worker's stale entries are dropped when its SUB
// connects to the new engine's publisher, not when (much later) the new engine's first
// event shows the sequence reset; the new engine's first frame is then a baseline.
func TestRestartDetectedAtReconnect(t *testing.T) {
	h := newHarness(t)
	pubPort, repPort := freePorts(t, 1), 0
	for repPort == 0 || repPort == pubPort {
		repPort = freePorts(t, 1)
	}
	opt := kvtest.Options{Endpoint: "tcp://127.0.0.1:" + itoa(pubPort), ReplayEndpoint: "tcp://127.0.0.1:" + itoa(repPort)}
	old := newPublisher(t, opt)
	h.addWorkers(workerFor("a", old))
	h.connected("a", old)
	_, _ = old.Publish(storedBatch(0, 2, 1, nil))
	h.eventually(func() bool { return h.held("a", toks(0, 2)) == 2 }, "blocks not stored")
	old.Close()
	var fresh *kvtest.Publisher
	h.eventually(func() bool { // the port may take a moment to be free again
		p, err := kvtest.New(opt)
		fresh = p
		return err == nil
	}, "could not re-bind the publisher's endpoints")
	t.Cleanup(fresh.Close)
	// Nothing published by the new engine yet: the reconnect alone drops the entries.
	h.eventually(func() bool { return h.held("a", toks(0, 2)) == 0 }, "stale entries kept after the publisher restarted")
	if n := testutil.ToFloat64(h.ms.Restarts.WithLabelValues("a")); n != 1 {
		t.Fatalf("restarts = %v, want 1", n)
	}
	h.eventually(func() bool {
		_, _ = fresh.Publish(storedBatch(500, 1, 1, nil))
		time.Sleep(5 * time.Millisecond)
		return h.held("a", toks(500, 1)) == 1
	}, "new engine's events not applied")
	if n := testutil.ToFloat64(h.ms.Restarts.WithLabelValues("a")); n != 1 {
		t.Fatalf("restarts = %v after the new engine's first frames, want 1 (a baseline, not another restart)", n)
	}
	if m := h.ix.Mode("a"); m != kvindex.ModeExact {
		t.Fatalf("mode %v, want exact", m)
	}
}

// Issue 10 item 15, bind mode (no reconnect to watch): a restart reported by the
// scraper (process start time changed) drops the worker's entries at once, and the new
// engine's first frame is a baseline.
func TestWorkerRestartedDropsEntries(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.BindEndpoint = "tcp://127.0.0.1:*" })
	ep := h.mgr.BoundEndpoint(t.Context())
	p := newPublisher(t, kvtest.Options{Endpoint: ep, Connect: true, Topic: "kv@10.0.0.1:8000@m"})
	h.addWorkers(&workers.Worker{Name: "a", Address: "10.0.0.1:8000", Models: []string{"m"}, KVEvents: workers.KVEvents{ReplayEndpoint: p.ReplayEndpoint()}})
	h.connected("a", p)
	_, _ = p.Publish(storedBatch(0, 2, 1, nil))
	h.eventually(func() bool { return h.held("a", toks(0, 2)) == 2 }, "blocks not stored")
	h.ix.Speculate("a", keysOf(toks(50, 1)))
	h.mgr.WorkerRestarted("a")
	if h.held("a", toks(0, 2)) != 0 || h.held("a", toks(50, 1)) != 0 {
		t.Fatal("entries kept after WorkerRestarted returned")
	}
	p.Restart()
	for i := 0; i < 3; i++ { // the new engine's seq 0..2 lost: its first frame seen is 3
		pl, _ := kvevents.Encode(storedBatch(300+10*i, 1, uint64(30+i), nil))
		_, _ = p.PublishRaw(pl, false)
	}
	_, _ = p.Publish(storedBatch(700, 1, 1, nil))
	h.eventually(func() bool { return h.held("a", toks(700, 1)) == 1 }, "new engine's first frame not applied")
	if m := h.ix.Mode("a"); m != kvindex.ModeExact {
		t.Fatalf("mode %v: the new engine's first frame is a baseline", m)
	}
	if h.held("a", toks(300, 1)) != 1 {
		t.Fatal("catch-up replay of the new engine's earlier frames not applied")
	}
	if n := testutil.ToFloat64(h.ms.Restarts.WithLabelValues("a")); n != 1 {
		t.Fatalf("restarts = %v, want 1", n)
	}
}
