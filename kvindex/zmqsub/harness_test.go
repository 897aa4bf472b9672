package zmqsub

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testport"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/kvindex/kvevents"
	"github.com/kvroute/kvroute/kvindex/kvtest"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/workers"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const bs = 4

// harness is the one fixture: a registry, an index (model "m", block size 4), a
// manager subscribed to the registry and running, and a goroutine leak check at the
// end. Adjust with opts rather than adding sibling constructors.
type harness struct {
	t   *testing.T
	reg *workers.Registry
	ix  *kvindex.Index
	ms  *metrics.Index
	mgr *Manager
}

func newHarness(t *testing.T, opts ...func(*Options)) *harness {
	t.Helper()
	base := runtime.NumGoroutine()
	ms := metrics.NewUnregistered().Index
	ix := kvindex.New(kvindex.Options{SpeculativeTTL: time.Minute, Models: []kvindex.Model{{Name: "m", BlockSize: bs}}, Metrics: ms})
	o := Options{Index: ix, Metrics: ms, ReplayTimeout: 2 * time.Second, PollInterval: 20 * time.Millisecond,
		ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond}
	for _, f := range opts {
		f(&o)
	}
	mgr, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, reg: workers.NewRegistry(), ix: ix, ms: ms, mgr: mgr}
	h.reg.Subscribe(mgr)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Run did not return within 5s of cancel: a socket owner is stuck")
		}
		h.eventually(func() bool { return runtime.NumGoroutine() <= base }, "goroutines leaked: %d now, %d before", runtime.NumGoroutine(), base)
	})
	return h
}

// eventually polls cond every 5 ms for up to 60 s (generous: ZMQ connects and
// replays under a loaded CI machine take far longer than on a quiet one).
func (h *harness) eventually(cond func() bool, format string, args ...any) {
	h.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out: "+format, args...)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// worker registers a worker subscribed to p (connect mode).
func (h *harness) addWorkers(ws ...*workers.Worker) { h.reg.Set(ws) }

func workerFor(name string, p *kvtest.Publisher) *workers.Worker {
	return &workers.Worker{Name: name, Address: "127.0.0.1:" + name, Models: []string{"m"},
		KVEvents: workers.KVEvents{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint()}}
}

func newPublisher(t *testing.T, opt kvtest.Options) *kvtest.Publisher {
	t.Helper()
	p, err := kvtest.New(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// connected publishes empty batches until worker has applied one: the SUB socket is
// connected (PUB drops everything before that: ZMQ's slow joiner).
func (h *harness) connected(worker string, p *kvtest.Publisher) {
	h.t.Helper()
	h.eventually(func() bool {
		if s, ok := h.ix.Summary(worker); ok && s.Batches > 0 {
			return true
		}
		_, _ = p.Publish(&kvevents.Batch{TS: 1, HasDPRank: true})
		time.Sleep(10 * time.Millisecond)
		return false
	}, "worker %s never received a batch", worker)
}

func toks(from, n int) []uint32 {
	out := make([]uint32, n*bs)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func keysOf(tokens []uint32) []kvindex.Key {
	return kvindex.HashBlocks(kvindex.Namespace{Model: "m"}.Seed(), tokens, bs, nil)
}

// storedBatch is one BlockStored of n blocks starting at token from, with engine
// hashes h0, h0+1, … and the given parent.
func storedBatch(from, n int, h0 uint64, parent *uint64) *kvevents.Batch {
	e := kvevents.Event{Type: kvevents.TypeBlockStored, TokenIDs: toks(from, n), BlockSize: bs, Medium: "GPU", SpecKind: "full_attention"}
	for i := 0; i < n; i++ {
		e.BlockHashes = append(e.BlockHashes, kvevents.Uint(h0+uint64(i)))
	}
	if parent != nil {
		ph := kvevents.Uint(*parent)
		e.Parent = &ph
	}
	return &kvevents.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: []kvevents.Event{e}, HasDPRank: true}
}

func removedBatch(hs ...uint64) *kvevents.Batch {
	e := kvevents.Event{Type: kvevents.TypeBlockRemoved, Medium: "GPU"}
	for _, x := range hs {
		e.BlockHashes = append(e.BlockHashes, kvevents.Uint(x))
	}
	return &kvevents.Batch{TS: 1, Events: []kvevents.Event{e}, HasDPRank: true}
}

// held returns how many leading blocks of tokens worker holds.
func (h *harness) held(worker string, tokens []uint32) int {
	for _, m := range h.ix.Lookup(keysOf(tokens), nil) {
		if m.Worker == worker {
			return m.Blocks
		}
	}
	return 0
}

// freePorts returns the first of n consecutive free TCP ports on 127.0.0.1 (for
// data-parallel ranks, which publish on port + rank), outside the kernel's ephemeral
// range (package testport says why).
func freePorts(t *testing.T, n int) int {
	t.Helper()
	return testport.Consecutive(t, n)
}

func fmtInt(i int) string { return fmt.Sprint(i) }

// diag describes worker's subscription counters and gauges, for failure messages.
func (h *harness) diag(worker string) string {
	m := h.ms
	c := func(v interface {
		WithLabelValues(...string) prometheus.Counter
	}) float64 {
		return testutil.ToFloat64(v.WithLabelValues(worker))
	}
	g := func(v *prometheus.GaugeVec) float64 { return testutil.ToFloat64(v.WithLabelValues(worker)) }
	r := func(res string) float64 { return testutil.ToFloat64(m.Replays.WithLabelValues(worker, res)) }
	mode := h.ix.Mode(worker)
	return fmt.Sprintf("[%s: mode=%v replays_pending=%v replay_buffered_frames=%v replay_buffered_bytes=%v restarts=%v gaps=%v queue_drops=%v decode_errors=%v disconnects=%v reconnects=%v replay_backoffs=%v overflows=%v discarded=%v replays ok/partial/failed/abandoned=%v/%v/%v/%v]",
		worker, mode, g(m.ReplaysPending), g(m.ReplayBufferedFrames), g(m.ReplayBufferedBytes), c(m.Restarts), c(m.Gaps), c(m.QueueDrops),
		c(m.DecodeErrors), c(m.Disconnects), c(m.Reconnects), c(m.ReplayBackoffs), c(m.ReplayBufferOverflows), c(m.ReplayBufferDiscarded),
		r("ok"), r("partial"), r("failed"), r("abandoned"))
}

// lazy formats as f() when printed (diagnostics computed at failure time).
type lazy func() string

func (l lazy) String() string { return l() }
