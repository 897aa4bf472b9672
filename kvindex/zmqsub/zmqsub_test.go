package zmqsub

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/kvindex/kvevents"
	"github.com/kvroute/kvroute/kvindex/kvtest"
	"github.com/kvroute/kvroute/workers"
)

func u(v uint64) *uint64 { return &v }

// The same event stream, published once without loss (a) and once with lost messages
// (b), must leave both workers' index entries identical once b's gaps are replayed.
func TestGapReplayEqualsGapFreeRun(t *testing.T) {
	for _, old := range []bool{false, true} {
		name := "replay with topic frame (vLLM >= 0.26)"
		if old {
			name = "replay without topic frame (older vLLM)"
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			pa := newPublisher(t, kvtest.Options{})
			pb := newPublisher(t, kvtest.Options{OldReplay: old})
			h.addWorkers(workerFor("a", pa), workerFor("b", pb))
			h.connected("a", pa)
			h.connected("b", pb)
			stream := []*kvevents.Batch{
				storedBatch(0, 3, 10, nil), storedBatch(12, 2, 13, u(12)), removedBatch(14),
				storedBatch(100, 2, 20, nil), removedBatch(21), storedBatch(200, 1, 30, nil),
			}
			for i, b := range stream {
				if _, err := pa.Publish(b); err != nil {
					t.Fatal(err)
				}
				pl, _ := kvevents.Encode(b)
				if _, err := pb.PublishRaw(pl, i != 1 && i != 2 && i != 4); err != nil { // b loses 3 messages
					t.Fatal(err)
				}
			}
			h.eventually(func() bool { return h.held("a", toks(200, 1)) == 1 && h.held("b", toks(200, 1)) == 1 }, "last block never arrived")
			for _, tk := range [][]uint32{toks(0, 5), toks(100, 2), toks(200, 1)} {
				if ha, hb := h.held("a", tk), h.held("b", tk); ha != hb {
					t.Fatalf("after replay b holds %d blocks of %v…, gap-free a holds %d", hb, tk[:2], ha)
				}
			}
			if got := h.held("b", toks(0, 5)); got != 4 {
				t.Fatalf("b holds %d of the first chain, want 4", got)
			}
			h.eventually(func() bool { return testutil.ToFloat64(h.ms.Replays.WithLabelValues("b", "ok")) >= 1 }, "no replay ok")
			if n := testutil.ToFloat64(h.ms.Gaps.WithLabelValues("b")); n < 1 {
				t.Fatalf("gaps = %v", n)
			}
			if h.ix.Mode("b") != kvindex.ModeExact {
				t.Fatalf("mode %v after a complete replay, want exact", h.ix.Mode("b"))
			}
		})
	}
}

func TestReplayBufferOverrunGoesApproximate(t *testing.T) {
	h := newHarness(t)
	p := newPublisher(t, kvtest.Options{Buffer: 2})
	h.addWorkers(workerFor("a", p))
	h.connected("a", p)
	for i := 0; i < 5; i++ { // lost, and evicted from the 2-batch replay buffer
		pl, _ := kvevents.Encode(storedBatch(i*100, 1, uint64(i+1)*10, nil))
		_, _ = p.PublishRaw(pl, false)
	}
	if _, err := p.Publish(storedBatch(1000, 1, 99, nil)); err != nil {
		t.Fatal(err)
	}
	h.eventually(func() bool { return testutil.ToFloat64(h.ms.Replays.WithLabelValues("a", "partial")) >= 1 }, "no partial replay")
	h.eventually(func() bool { return h.held("a", toks(1000, 1)) == 1 }, "live batch not applied")
	if m := h.ix.Mode("a"); m != kvindex.ModeApproximate {
		t.Fatalf("mode %v, want approximate after an incomplete replay", m)
	}
	if h.held("a", toks(400, 1)) != 1 {
		t.Fatal("what the replay buffer still held must be applied")
	}
}

func TestRestartDropsOldEntries(t *testing.T) {
	h := newHarness(t)
	p := newPublisher(t, kvtest.Options{})
	h.addWorkers(workerFor("a", p))
	h.connected("a", p)
	_, _ = p.Publish(storedBatch(0, 2, 1, nil))
	h.eventually(func() bool { return h.held("a", toks(0, 2)) == 2 }, "blocks not stored")
	p.Restart() // seq back to 0, new engine: hash 1 now means other content
	_, _ = p.Publish(storedBatch(500, 1, 1, nil))
	h.eventually(func() bool { return h.held("a", toks(500, 1)) == 1 }, "post-restart block not stored")
	if got := h.held("a", toks(0, 2)); got != 0 {
		t.Fatalf("pre-restart blocks still held: %d", got)
	}
	if n := testutil.ToFloat64(h.ms.Restarts.WithLabelValues("a")); n != 1 {
		t.Fatalf("restarts = %v", n)
	}
}

func TestMalformedPayloadAmongGoodOnes(t *testing.T) {
	h := newHarness(t)
	p := newPublisher(t, kvtest.Options{})
	h.addWorkers(workerFor("a", p))
	h.connected("a", p)
	_, _ = p.Publish(storedBatch(0, 1, 1, nil))
	_, _ = p.PublishRaw([]byte{0x93, 0xc1, 0xff}, true)
	_, _ = p.Publish(storedBatch(100, 1, 2, nil))
	h.eventually(func() bool { return h.held("a", toks(100, 1)) == 1 }, "batch after the malformed one not applied")
	if h.held("a", toks(0, 1)) != 1 {
		t.Fatal("batch before the malformed one lost")
	}
	if n := testutil.ToFloat64(h.ms.DecodeErrors.WithLabelValues("a")); n != 1 {
		t.Fatalf("decode errors = %v, want 1", n)
	}
	if n := testutil.ToFloat64(h.ms.Gaps.WithLabelValues("a")); n != 0 {
		t.Fatalf("a malformed payload still consumes its seq: gaps = %v", n)
	}
}

func TestTwoDPRanks(t *testing.T) {
	h := newHarness(t)
	pubPort, repPort := freePorts(t, 2), 0
	for repPort == 0 || (repPort >= pubPort-1 && repPort <= pubPort+1) {
		repPort = freePorts(t, 2)
	}
	ep := func(port, r int) string { return "tcp://127.0.0.1:" + itoa(port+r) }
	var ps []*kvtest.Publisher
	for r := 0; r < 2; r++ {
		ps = append(ps, newPublisher(t, kvtest.Options{Endpoint: ep(pubPort, r), ReplayEndpoint: ep(repPort, r)}))
	}
	w := &workers.Worker{Name: "dp", Address: "127.0.0.1:1", Models: []string{"m"},
		KVEvents: workers.KVEvents{Endpoint: ep(pubPort, 0), ReplayEndpoint: ep(repPort, 0), DPSize: 2}}
	h.addWorkers(w)
	for r, p := range ps {
		before := testutil.ToFloat64(h.ms.Batches.WithLabelValues("dp"))
		h.eventually(func() bool { // wait until this rank's SUB is connected
			_, _ = p.Publish(&kvevents.Batch{TS: 1, DPRank: r, HasDPRank: true})
			return testutil.ToFloat64(h.ms.Batches.WithLabelValues("dp")) > before
		}, "rank %d never connected", r)
		b := storedBatch(r*1000, 1, 7, nil) // same engine hash on both ranks: separate processes
		b.DPRank = r
		_, _ = p.Publish(b)
		h.eventually(func() bool { return h.held("dp", toks(r*1000, 1)) == 1 }, "rank %d never applied", r)
	}
	// Rank 1 removes its hash 7; rank 0's hash 7 (other content) must stay.
	b := removedBatch(7)
	b.DPRank = 1
	_, _ = ps[1].Publish(b)
	h.eventually(func() bool { return h.held("dp", toks(1000, 1)) == 0 }, "rank 1 removal not applied")
	if h.held("dp", toks(0, 1)) != 1 {
		t.Fatal("rank 1's removal released rank 0's block")
	}
}

func TestBindMode(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.BindEndpoint = "tcp://127.0.0.1:*" })
	ep := h.mgr.BoundEndpoint(t.Context())
	if ep == "" {
		t.Fatal("no bound endpoint")
	}
	pa := newPublisher(t, kvtest.Options{Endpoint: ep, Connect: true, Topic: "kv@10.0.0.1:8000@m"})
	pb := newPublisher(t, kvtest.Options{Endpoint: ep, Connect: true, Topic: "kv@10.0.0.2:8000@m"})
	h.addWorkers(
		&workers.Worker{Name: "a", Address: "10.0.0.1:8000", Models: []string{"m"}, KVEvents: workers.KVEvents{ReplayEndpoint: pa.ReplayEndpoint()}},
		&workers.Worker{Name: "b", Address: "10.0.0.2:8000", Models: []string{"m"}, KVEvents: workers.KVEvents{ReplayEndpoint: pb.ReplayEndpoint()}},
	)
	h.connected("a", pa)
	h.connected("b", pb)
	_, _ = pa.Publish(storedBatch(0, 2, 1, nil))
	_, _ = pb.Publish(storedBatch(0, 1, 1, nil))
	h.eventually(func() bool { return h.held("a", toks(0, 2)) == 2 && h.held("b", toks(0, 2)) == 1 },
		"bind mode attributes messages by topic: a=%d b=%d", h.held("a", toks(0, 2)), h.held("b", toks(0, 2)))
}

func TestWorkerRemovedReleasesEntriesAndSockets(t *testing.T) {
	h := newHarness(t)
	pa := newPublisher(t, kvtest.Options{})
	pb := newPublisher(t, kvtest.Options{})
	wa, wb := workerFor("a", pa), workerFor("b", pb)
	h.addWorkers(wa, wb)
	h.connected("a", pa)
	h.connected("b", pb)
	_, _ = pa.Publish(storedBatch(0, 3, 1, nil))
	_, _ = pb.Publish(storedBatch(0, 1, 1, nil))
	h.eventually(func() bool { return h.held("a", toks(0, 3)) == 3 && h.held("b", toks(0, 3)) == 1 }, "not applied")
	h.addWorkers(wb) // a removed from the configuration
	if h.held("a", toks(0, 3)) != 0 || h.ix.Entries() != 1 {
		t.Fatalf("a's entries not released: held %d, entries %d", h.held("a", toks(0, 3)), h.ix.Entries())
	}
	// a's publisher keeps publishing: nothing may reach the index.
	_, _ = pa.Publish(storedBatch(50, 1, 9, nil))
	_, _ = pb.Publish(storedBatch(60, 1, 9, nil))
	h.eventually(func() bool { return h.held("b", toks(60, 1)) == 1 }, "b stopped")
	if h.held("a", toks(50, 1)) != 0 {
		t.Fatal("a removed worker's socket still feeds the index")
	}
	// the leak check in the harness cleanup verifies a's goroutines (and sockets) ended
}

func TestFloodWithTinyQueueConverges(t *testing.T) {
	// a 1-message queue; the reorder buffer (which would default to the queue size)
	// sized so that the live frames arriving during each replay fit
	h := newHarness(t, func(o *Options) { o.QueueSize = 1; o.ReplayBufferFrames = 4096 })
	p := newPublisher(t, kvtest.Options{})
	h.addWorkers(workerFor("a", p))
	h.connected("a", p)
	const n = 300
	for i := 0; i < n; i++ {
		_, _ = p.Publish(storedBatch(i*100, 1, uint64(i+1), nil))
	}
	h.eventually(func() bool {
		for i := 0; i < n; i++ {
			if h.held("a", toks(i*100, 1)) != 1 {
				return false
			}
		}
		return true
	}, "drops must be recovered by replay")
	t.Logf("queue drops %v, replays ok %v", testutil.ToFloat64(h.ms.QueueDrops.WithLabelValues("a")),
		testutil.ToFloat64(h.ms.Replays.WithLabelValues("a", "ok")))
}

func TestTopicPattern(t *testing.T) {
	re, err := CompileTopicPattern("kv@{addr}@{model}")
	if err != nil {
		t.Fatal(err)
	}
	g := re.FindStringSubmatch("kv@10.1.2.3:8000@Qwen/Qwen3-8B")
	if g == nil || g[re.SubexpIndex("addr")] != "10.1.2.3:8000" || g[re.SubexpIndex("model")] != "Qwen/Qwen3-8B" {
		t.Fatalf("%q", g)
	}
	if _, err := CompileTopicPattern("kv@{model}"); err == nil {
		t.Fatal("a pattern without {addr} cannot attribute messages")
	}
	if EndpointForRank("tcp://10.0.0.1:5557", 3) != "tcp://10.0.0.1:5560" || EndpointForRank("ipc:///tmp/kv", 1) != "ipc:///tmp/kv_dp1" {
		t.Fatal("rank endpoints")
	}
}

func itoa(i int) string { return fmtInt(i) }
