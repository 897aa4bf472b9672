package peers

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/workers"
)

// replica is one router with its index and exchange, serving on a loopback port.
type replica struct {
	r      *router.Router
	ix     *kvindex.Index
	m      *Manager
	ms     *metrics.Set
	addr   string
	cancel context.CancelFunc
	done   chan error
}

// testRouter is a router over workers w0 and w1 (model "m") with its index.
func testRouter() (*router.Router, *kvindex.Index, *metrics.Set) {
	reg := workers.NewRegistry()
	ms := metrics.NewUnregistered()
	ix := kvindex.New(kvindex.Options{SpeculativeTTL: time.Minute, Metrics: ms.Index})
	reg.Subscribe(ix)
	reg.Set([]*workers.Worker{{Name: "w0", Address: "127.0.0.1:1", Models: []string{"m"}}, {Name: "w1", Address: "127.0.0.1:2", Models: []string{"m"}}})
	return router.New(router.Options{Registry: reg, Index: ix, Metrics: ms}), ix, ms
}

func startReplica(t *testing.T, id string, silence time.Duration, mods ...func(*Options)) *replica {
	t.Helper()
	r, ix, ms := testRouter()
	o := Options{ID: id, Router: r, Index: ix, SilenceTimeout: silence, Metrics: ms.Peers}
	for _, mod := range mods {
		mod(&o)
	}
	m, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rep := &replica{r: r, ix: ix, m: m, ms: ms, addr: ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { rep.done <- m.Run(ctx, ln) }()
	t.Cleanup(rep.stop)
	return rep
}

func (rep *replica) stop() {
	rep.cancel()
	<-rep.done
	rep.done <- nil // later stops return at once
}

func (rep *replica) peer(addr string) { rep.m.WorkerAdded(&workers.Worker{Name: addr, Address: addr}) }

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func prompt(n int) *request.Request {
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(1000 + i)
	}
	return &request.Request{API: request.APICompletions, Model: "m", PromptTokenIDs: [][]uint32{ids}}
}

// peeredPair starts replicas "a" and "b" (5 s silence timeout), each the other's peer.
func peeredPair(t *testing.T) (a, b *replica) {
	a = startReplica(t, "a", 5*time.Second)
	b = startReplica(t, "b", 5*time.Second)
	a.peer(b.addr)
	b.peer(a.addr)
	return a, b
}

func TestBookingsAndPrefixesReachPeers(t *testing.T) {
	a, b := peeredPair(t)

	tk, err := a.r.Pick(context.Background(), prompt(320), router.PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b imports a's booking", func() bool {
		pb := b.r.PeerBookings()[tk.Worker]
		return pb.Requests == 1 && pb.Prefilling == 1 && pb.PrefillTokens == 320
	})
	// a's 20 blocks being prefilled are speculative entries on the same worker at b.
	keys := kvindex.HashBlocks(kvindex.Namespace{Model: "m"}.Seed(), prompt(320).PromptTokenIDs[0], 16, nil)
	waitFor(t, "b holds a's prefix", func() bool {
		for _, mt := range b.ix.Lookup(keys, nil) {
			if mt.Worker == tk.Worker && mt.Blocks == 20 {
				return true
			}
		}
		return false
	})
	// b's candidates carry a's booking and a's prefix (router.Explain: what Pick sees).
	ex, err := b.r.Explain(context.Background(), prompt(320), router.PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ex.Candidates {
		want, cached := 0, 0
		if c.Worker.Name == tk.Worker {
			want, cached = 1, 304
		}
		if c.Booked.Requests != want || c.CachedTokens != cached {
			t.Fatalf("b's candidate %s: booked %+v cached %d, want %d requests and %d cached", c.Worker.Name, c.Booked, c.CachedTokens, want, cached)
		}
	}
	tb, err := b.r.Pick(context.Background(), prompt(320), router.PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(b.ms.Peers.BookingsImported); got != 1 {
		t.Fatalf("imported bookings %v, want 1", got)
	}
	tk.FirstToken(time.Time{})
	waitFor(t, "b sees a's request decoding", func() bool {
		pb := b.r.PeerBookings()[tk.Worker]
		return pb.Requests == 1 && pb.Decoding == 1 && pb.Prefilling == 0 && pb.PrefillTokens == 0
	})
	tk.Abort()
	tb.Abort()
	waitFor(t, "a's bookings gone at b", func() bool { return b.r.PeerBookings()[tk.Worker].Requests == 0 })
	waitFor(t, "b's bookings gone at a", func() bool { return a.r.PeerBookings()[tk.Worker].Requests == 0 })
	if v := b.m.Snapshot(); len(v.Peers) != 1 || v.Peers[0].ID != "a" || v.BytesReceived == 0 || v.BytesSent == 0 {
		t.Fatalf("view %+v", v)
	}
}

func TestStoppedPeerIsDropped(t *testing.T) {
	a := startReplica(t, "a", time.Minute) // silence far away: the stream's end drops it
	b := startReplica(t, "b", time.Minute)
	a.peer(b.addr)
	b.peer(a.addr) // without authentication b admits a from a target's address only
	tk, err := a.r.Pick(context.Background(), prompt(64), router.PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Abort()
	waitFor(t, "b imports a's booking", func() bool { return b.r.PeerBookings()[tk.Worker].Requests == 1 })
	a.stop()
	waitFor(t, "b drops a", func() bool { return b.r.PeerBookings()[tk.Worker].Requests == 0 })
	if got := testutil.ToFloat64(b.ms.Peers.Expired.WithLabelValues(ExpireStream)); got != 1 {
		t.Fatalf("expired{stream_ended} = %v", got)
	}
	keys := kvindex.HashBlocks(kvindex.Namespace{Model: "m"}.Seed(), prompt(64).PromptTokenIDs[0], 16, nil)
	if ms := b.ix.Lookup(keys, nil); len(ms) != 0 {
		t.Fatalf("a's imported prefix still at b: %+v", ms)
	}
}

// A peer whose connection stays open but sends nothing (hung, partitioned behind a
// proxy) is dropped after the silence timeout.
func TestSilentPeerExpires(t *testing.T) {
	b := startReplica(t, "b", 300*time.Millisecond)
	b.peer("127.0.0.1:1") // unauthenticated peers are admitted from a target's address only
	cc, err := grpc.NewClient(b.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	st, err := openStream(context.Background(), cc)
	if err != nil {
		t.Fatal(err)
	}
	s := sampleSummary()
	if err := st.SendMsg(&frame{b: encode(nil, s)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b imports r1", func() bool { return b.r.PeerBookings()["w0"].Requests == 3 })
	waitFor(t, "b expires silent r1 and drops its bookings", func() bool {
		// The counter moves just before the bookings are republished (one critical section).
		return testutil.ToFloat64(b.ms.Peers.Expired.WithLabelValues(ExpireSilent)) == 1 && b.r.PeerBookings()["w0"].Requests == 0
	})
	// A stale summary (older seq) is dropped; an older incarnation's restart is not.
	if err := st.SendMsg(&frame{b: encode(nil, s)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "r1 back after speaking again", func() bool { return b.r.PeerBookings()["w0"].Requests == 3 })
	if err := st.SendMsg(&frame{b: encode(nil, s)}); err != nil { // same seq: stale
		t.Fatal(err)
	}
	waitFor(t, "stale counted", func() bool { return testutil.ToFloat64(b.ms.Peers.Dropped.WithLabelValues(DropStale)) == 1 })
}

func TestMalformedSummaryEndsStream(t *testing.T) {
	b := startReplica(t, "b", time.Minute)
	cc, err := grpc.NewClient(b.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	st, err := openStream(context.Background(), cc)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SendMsg(&frame{b: []byte{1, 200, 200, 200}}); err != nil {
		t.Fatal(err)
	}
	if err := st.RecvMsg(&frame{}); err == nil {
		t.Fatal("stream survived a malformed summary")
	}
	if got := testutil.ToFloat64(b.ms.Peers.Dropped.WithLabelValues(DropMalformed)); got != 1 {
		t.Fatalf("dropped{malformed} = %v", got)
	}
	// An oversized message is refused by gRPC before it is read.
	st, err = openStream(context.Background(), cc)
	if err != nil {
		t.Fatal(err)
	}
	_ = st.SendMsg(&frame{b: make([]byte, DefaultMaxMessageBytes+1)})
	if err := st.RecvMsg(&frame{}); err == nil {
		t.Fatal("oversized summary accepted")
	}
}

// A replica listed among its own targets (discovery lists every replica) stops
// sending there.
func TestSelfTargetStops(t *testing.T) {
	a := startReplica(t, "a", time.Minute)
	a.peer(a.addr)
	waitFor(t, "self detected", func() bool {
		v := a.m.Snapshot()
		return len(v.Targets) == 1 && v.Targets[0].Self
	})
	if v := a.m.Snapshot(); len(v.Peers) != 0 {
		t.Fatalf("a holds itself as a peer: %+v", v.Peers)
	}
}

// A peer's first-token and finish times reach the receiver (millisecond precision),
// merged per worker with its bookings.
func TestLeftTimesReachPeers(t *testing.T) {
	a, b := peeredPair(t)
	tk, err := a.r.Pick(context.Background(), prompt(320), router.PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first := time.Now().Truncate(time.Millisecond)
	tk.FirstToken(first)
	waitFor(t, "b sees a's first token", func() bool {
		pb := b.r.PeerBookings()[tk.Worker]
		return pb.Decoding == 1 && len(pb.FirstTokens) == 1 && pb.FirstTokens[0].Equal(first)
	})
	tk.Done(200, response.Usage{}, time.Time{})
	waitFor(t, "b sees a's finish", func() bool {
		pb := b.r.PeerBookings()[tk.Worker]
		return pb.Requests == 0 && len(pb.FirstTokens) == 1 && len(pb.Finished) == 1 &&
			!pb.Finished[0].Before(first) && pb.Finished[0].Sub(first) < time.Minute
	})
}
