//go:build soak

package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/peers"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// The trust soak's peers exchange: the replica under test and an honest peer replica
// exchange bookings with a shared token, as a deployment with peers.token does, and a
// hostile party attacks the replica under test in rounds (soakPeers.attack).

const (
	soakWorkers  = 4
	soakAttacked = "w0" // the worker the compromised replica claims huge bookings on
	soakToken    = "soak peers token"
	// soakPeerMsgBytes is peers.max_message_bytes for the replica under test: a
	// quarter of the default, so that the floods fit two shared cores.
	soakPeerMsgBytes = 1 << 20
)

// discardLogger keeps a round's hundreds of peer state lines out of the soak's output.
var discardLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// soakFleet is soakWorkers SSE workers on loopback, counting the requests each serves.
type soakFleet struct {
	servers []*httptest.Server
	served  []atomic.Int64
	reg     *workers.Registry
}

func newSoakFleet() *soakFleet {
	f := &soakFleet{served: make([]atomic.Int64, soakWorkers), reg: workers.NewRegistry()}
	var ws []*workers.Worker
	for i := range soakWorkers {
		h := sseWorker()
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			f.served[i].Add(1)
			h.ServeHTTP(w, r)
		}))
		f.servers = append(f.servers, s)
		ws = append(ws, &workers.Worker{Name: fmt.Sprintf("w%d", i), Address: strings.TrimPrefix(s.URL, "http://"), Models: []string{"m"}})
	}
	f.reg.Set(ws)
	return f
}

func (f *soakFleet) close() {
	for _, s := range f.servers {
		s.CloseClientConnections()
		s.Close()
	}
}

func (f *soakFleet) total() (n int64) {
	for i := range f.served {
		n += f.served[i].Load()
	}
	return n
}

// perWorker is the requests each worker served, and the attacked worker's share.
func (f *soakFleet) perWorker() (map[string]int64, float64) {
	out := map[string]int64{}
	var total int64
	for i := range f.served {
		n := f.served[i].Load()
		out[fmt.Sprintf("w%d", i)] = n
		total += n
	}
	if total == 0 {
		return out, 0
	}
	return out, float64(out[soakAttacked]) / float64(total)
}

// soakReplica is one kvroute replica's peers exchange, built from config.Peers as the
// app builds it (app/peers.go) and running on its own loopback listener.
type soakReplica struct {
	m    *peers.Manager
	ms   *metrics.Set
	addr string
	reg  *workers.Registry // peer targets
	done chan struct{}
}

func startSoakReplica(t *testing.T, ctx context.Context, id string, r *router.Router, ms *metrics.Set) *soakReplica {
	t.Helper()
	pc := config.Default().Peers
	pc.ID, pc.Token, pc.MaxMessageBytes = id, soakToken, soakPeerMsgBytes
	m, err := peers.New(peers.Options{ID: pc.ID, Router: r, Interval: pc.Interval,
		SilenceTimeout: pc.SilenceTimeout, MaxMessageBytes: pc.MaxMessageBytes, MaxKeysPerWorker: pc.MaxKeysPerWorker,
		MaxPeers: pc.MaxPeers, MaxInboundBytes: pc.MaxInboundBytes, Metrics: ms.Peers, Logger: discardLogger, Auth: peers.Auth{Token: pc.Token},
		Claims: peers.Claims{MaxRequests: pc.MaxRequestsPerWorker, MaxPromptTokens: config.Default().Router.MaxPromptTokens}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &soakReplica{m: m, ms: ms, addr: ln.Addr().String(), reg: workers.NewRegistry(), done: make(chan struct{})}
	s.reg.Subscribe(m)
	go func() { defer close(s.done); _ = m.Run(ctx, ln) }()
	return s
}

func (s *soakReplica) dial(addr string) {
	s.reg.Set([]*workers.Worker{{Name: addr, Address: addr}})
}

// hostileLocal is what a hostile replica claims: on worker, requests booked and
// prefilling, and keys block keys on each of workers (names w0…), changed at every
// look so that every Interval carries a fresh summary.
type hostileLocal struct {
	worker  string
	claim   int
	workers int
	keys    int
	n       atomic.Uint64
}

func (h *hostileLocal) Changes() uint64 { return h.n.Add(1) }

func (h *hostileLocal) LocalBookings(maxKeys int) []router.WorkerBookings {
	var out []router.WorkerBookings
	for w := range max(h.workers, 1) {
		wb := router.WorkerBookings{Worker: fmt.Sprintf("w%d", w), Booked: scoring.Booked{Requests: 1, Prefilling: 1, PrefillTokens: 16}}
		if wb.Worker == h.worker {
			wb.Booked = scoring.Booked{Requests: h.claim, Prefilling: h.claim, PrefillTokens: h.claim}
			wb.OldestPrefill = time.Now().Add(-time.Hour)
			wb.Writes, wb.WritesAt = float64(h.claim), time.Now()
		}
		for range min(h.keys, maxKeys) {
			wb.Keys = append(wb.Keys, kvindex.Key(rand.Uint64()))
		}
		out = append(out, wb)
	}
	return out
}

func (h *hostileLocal) SetPeerBookings(map[string]router.PeerWorker) {}

// hostile is one hostile replica: a real peers.Manager (as a compromised or forged
// kvroute would run) with a hostileLocal, streaming to target.
func hostile(ctx context.Context, wg *sync.WaitGroup, id, token, target string, l *hostileLocal) {
	m, err := peers.New(peers.Options{ID: id, Router: l, Interval: 100 * time.Millisecond, MaxMessageBytes: soakPeerMsgBytes,
		Auth: peers.Auth{Token: token}, Logger: discardLogger, MaxKeysPerWorker: peers.DefaultMaxKeysPerWorker})
	if err != nil {
		panic(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return
	}
	m.WorkerAdded(&workers.Worker{Name: target, Address: target})
	wg.Add(1)
	go func() { defer wg.Done(); _ = m.Run(ctx, ln) }()
}

// soakAttack counts what the hostile party did and saw.
type soakAttack struct {
	rounds          atomic.Int64
	forgedHeld      atomic.Int64 // samples where a forged (tokenless) id held a peer state
	maxStates       atomic.Int64 // most peer states held at a sample
	bullyHeldSample atomic.Int64 // samples where the compromised replica's claim was held
	// Requests the workers served while the compromised replica's claim was held
	// (from its first sample held to the round's end), and those on soakAttacked.
	underAttack, attackedUnderAttack atomic.Int64
}

// attack runs rounds until ctx ends: every 15 s, for 5 s, (a) 8 replicas without the
// token with fake ids, (b) a compromised replica holding the token claiming 2^39
// booked requests on soakAttacked, 8 more flooding near-max-size summaries (8 workers ×
// 16,384 keys, cut to max_message_bytes), and 72 inventing a fresh replica id each
// (past peers.max_peers with the honest peer).
func (s *soakReplica) attack(ctx context.Context, a *soakAttack, f *soakFleet) {
	for round := 0; ; round++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Second):
		}
		a.rounds.Add(1)
		rctx, stop := context.WithTimeout(ctx, 5*time.Second)
		var wg sync.WaitGroup
		for i := range 8 {
			hostile(rctx, &wg, fmt.Sprintf("forged-%d-%d", round, i), "", s.addr, &hostileLocal{worker: soakAttacked, claim: 1 << 39})
		}
		hostile(rctx, &wg, fmt.Sprintf("bully-%d", round), soakToken, s.addr, &hostileLocal{worker: soakAttacked, claim: 1 << 39})
		for i := range 8 {
			hostile(rctx, &wg, fmt.Sprintf("flood-%d-%d", round, i), soakToken, s.addr, &hostileLocal{workers: 8, keys: 16384})
		}
		for i := range 72 {
			hostile(rctx, &wg, fmt.Sprintf("invented-%d-%d", round, i), soakToken, s.addr, &hostileLocal{})
		}
		var at0, all0 int64 = -1, 0
		for rctx.Err() == nil {
			v := s.m.Snapshot()
			if n := int64(len(v.Peers)); n > a.maxStates.Load() {
				a.maxStates.Store(n)
			}
			for _, p := range v.Peers {
				if strings.HasPrefix(p.ID, "forged-") {
					a.forgedHeld.Add(1)
				}
				if strings.HasPrefix(p.ID, "bully-") {
					a.bullyHeldSample.Add(1)
					if at0 < 0 {
						at0, all0 = f.served[0].Load(), f.total()
					}
				}
			}
			time.Sleep(250 * time.Millisecond)
		}
		if at0 >= 0 {
			a.attackedUnderAttack.Add(f.served[0].Load() - at0)
			a.underAttack.Add(f.total() - all0)
		}
		stop()
		wg.Wait()
	}
}

// report is the exchange's end state for the soak's JSON.
func (s *soakReplica) report(f *soakFleet, a *soakAttack) map[string]any {
	dropped, expired := map[string]float64{}, map[string]float64{}
	for _, r := range []string{peers.DropMalformed, peers.DropStale, peers.DropSelf, peers.DropTooManyPeers, peers.DropBusy, peers.DropUnauthenticated, peers.DropUnknownPeer} {
		dropped[r] = testutil.ToFloat64(s.ms.Peers.Dropped.WithLabelValues(r))
	}
	for _, r := range []string{peers.ExpireSilent, peers.ExpireStream} {
		expired[r] = testutil.ToFloat64(s.ms.Peers.Expired.WithLabelValues(r))
	}
	var held []string
	for _, p := range s.m.Snapshot().Peers {
		held = append(held, p.ID)
	}
	per, share := f.perWorker()
	return map[string]any{
		"workers": soakWorkers, "requests_per_worker": per, "attacked_worker": soakAttacked, "attacked_share": share,
		"peer_rounds": a.rounds.Load(), "peers_dropped": dropped, "peers_expired": expired, "peer_states_held": held,
		"peer_states_max": a.maxStates.Load(), "forged_state_samples": a.forgedHeld.Load(), "bully_held_samples": a.bullyHeldSample.Load(),
		"requests_under_attack": a.underAttack.Load(), "attacked_share_under_attack": float64(a.attackedUnderAttack.Load()) / float64(max(a.underAttack.Load(), 1)),
		"peers_clamped":           testutil.ToFloat64(s.ms.Peers.Clamped),
		"peers_bytes_received":    testutil.ToFloat64(s.ms.Peers.BytesReceived),
		"peers_inbound_bytes":     testutil.ToFloat64(s.ms.Peers.InboundBytes),
		"peers_imported_bookings": testutil.ToFloat64(s.ms.Peers.BookingsImported),
	}
}
