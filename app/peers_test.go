package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/testrun"
	"github.com/kvroute/kvroute/peers"
	"github.com/kvroute/kvroute/sim"
)

// simWorkers starts n simulated vLLM workers (package sim: real HTTP on loopback, a
// prefix cache whose hits and misses are the workers' own counts). A 2,048-token
// prefix takes ~0.4 s to prefill.
func simWorkers(t *testing.T, n int) ([]*sim.Worker, []string) {
	t.Helper()
	p := sim.Profile{Name: "peers-test", Model: "m", StepOverhead: 2 * time.Millisecond, PrefillPerToken: 200 * time.Microsecond,
		DecodePerSeq: 2 * time.Millisecond, BlockSize: 16, NumBlocks: 8192, MaxNumSeqs: 64, MaxBatchTokens: 4096}
	var ws []*sim.Worker
	var addrs []string
	for i := 0; i < n; i++ {
		w, err := sim.NewWorker(sim.WorkerOptions{Profile: p, Seed: uint64(i + 1), PromptTokensDetails: true})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { w.Runner.Run(ctx); close(done) }()
		srv := httptest.NewServer(w)
		t.Cleanup(func() { srv.Close(); cancel(); <-done })
		ws = append(ws, w)
		addrs = append(addrs, strings.TrimPrefix(srv.URL, "http://"))
	}
	return ws, addrs
}

type replicaApp struct {
	a    *App
	url  string
	stop func() // testrun.Start's: cancel, wait for Run, fail on its error
}

// startReplicas runs n kvroute Apps (proxy front) over the same workers; with share
// they list each other (and themselves) in peers.static.
func startReplicas(t *testing.T, n int, share bool, workerAddrs []string) []*replicaApp {
	t.Helper()
	listen := func() net.Listener { return testrun.Listen(t) }
	peerLns := make([]net.Listener, n)
	var static []string
	for i := range peerLns {
		peerLns[i] = listen()
		static = append(static, peerLns[i].Addr().String())
	}
	var out []*replicaApp
	for i := 0; i < n; i++ {
		cfg := config.Default()
		cfg.Models = []config.Model{{Name: "m"}}
		for j, addr := range workerAddrs {
			cfg.Workers = append(cfg.Workers, config.Worker{Name: fmt.Sprintf("w%d", j), Address: addr})
		}
		cfg.Server.ShutdownGrace = time.Second
		ls := Listeners{Proxy: listen(), Admin: listen()}
		if share {
			cfg.Peers.ListenAddr, cfg.Peers.Static, cfg.Peers.ID = peerLns[i].Addr().String(), static, fmt.Sprintf("kvroute-%d", i)
			ls.Peers = peerLns[i]
		} else {
			peerLns[i].Close()
		}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		a, err := New(&cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, &replicaApp{a: a, url: "http://" + ls.Proxy.Addr().String(), stop: testrun.Start(t, a, ls)})
	}
	return out
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// promptBody is a completion request with prompt token ids: a shared prefix of
// prefix tokens and a unique suffix of 16.
func promptBody(prefix, i, maxTokens int) string {
	var b strings.Builder
	b.WriteString(`{"model":"m","max_tokens":`)
	fmt.Fprintf(&b, "%d", maxTokens)
	b.WriteString(`,"prompt":[`)
	for j := 0; j < prefix; j++ {
		fmt.Fprintf(&b, "%d,", 5000+j)
	}
	for j := 0; j < 16; j++ {
		if j > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d", 100000+i*16+j)
	}
	b.WriteString("]}")
	return b.String()
}

func post(t *testing.T, url, body string) {
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("status %d", resp.StatusCode)
	}
}

type burstResult struct {
	prefilled int   // workers that computed the shared prefix cold (their own prefix-cache misses)
	perWorker []int // requests routed to each worker, over all replicas
}

// burst sends one request for a new 4,000-token prefix to replica 0 and waits until
// it is done (and, when they share, until every other replica imported its prefix),
// then sends the rest concurrently, round-robin over the replicas. The workers publish
// no KV events here: what a replica knows of another's prefix is what the exchange
// brought.
func burst(t *testing.T, n int, share bool, requests int) burstResult {
	const prefix = 4000
	ws, addrs := simWorkers(t, 4)
	reps := startReplicas(t, n, share, addrs)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); post(t, reps[0].url, promptBody(prefix, 0, 4)) }()
	waitUntil(t, "the first request routed", func() bool { return decisions(reps[0].a, "") == 1 })
	if share {
		for _, r := range reps[1:] {
			waitUntil(t, "peers import the first request's prefix", func() bool {
				return testutil.ToFloat64(r.a.Metrics.Peers.KeysImported) >= prefix/16
			})
		}
	}
	wg.Wait()  // the prefix is now cached on the first request's worker
	if share { // and the peers saw it end (within one exchange interval)
		for _, r := range reps[1:] {
			waitUntil(t, "peers see the first request end", func() bool {
				return testutil.ToFloat64(r.a.Metrics.Peers.BookingsImported) == 0
			})
		}
	}
	for i := 1; i < requests; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); post(t, reps[i%n].url, promptBody(prefix, i, 4)) }()
	}
	wg.Wait()
	var res burstResult
	for j, w := range ws {
		st := w.Runner.Stats()
		if st.PrefixQueries-st.PrefixHits >= prefix-16 {
			res.prefilled++
		}
		c := 0
		for _, r := range reps {
			c += decisions(r.a, fmt.Sprintf("w%d", j))
		}
		res.perWorker = append(res.perWorker, c)
	}
	for _, r := range reps {
		waitUntil(t, "in-flight back to 0", func() bool { return r.a.Router.InFlight() == 0 })
	}
	return res
}

// decisions sums kvroute_router_decisions_total for worker ("" = all).
func decisions(a *App, worker string) int {
	mfs, _ := a.Gatherer.Gather()
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "kvroute_router_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "worker" && (worker == "" || l.GetValue() == worker) {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return int(n)
}

func TestReplicasShareBookingsAndPrefixes(t *testing.T) {
	const requests = 12
	one := burst(t, 1, false, requests)
	shared := burst(t, 3, true, requests)
	blind := burst(t, 3, false, requests)
	t.Logf("workers that prefilled the prefix: 1 replica %d %v, 3 shared %d %v, 3 blind %d %v",
		one.prefilled, one.perWorker, shared.prefilled, shared.perWorker, blind.prefilled, blind.perWorker)
	if shared.prefilled > one.prefilled {
		t.Errorf("3 sharing replicas prefilled the prefix on %d workers, one replica on %d", shared.prefilled, one.prefilled)
	}
	if slices.Max(shared.perWorker) > slices.Max(one.perWorker) {
		t.Errorf("sharing replicas piled %v on workers, one replica %v", shared.perWorker, one.perWorker)
	}
	if blind.prefilled <= shared.prefilled {
		t.Errorf("3 blind replicas prefilled the prefix on %d workers, sharing ones on %d: no duplicates shown", blind.prefilled, shared.prefilled)
	}
}

func TestKilledReplicaBookingsDropped(t *testing.T) {
	_, addrs := simWorkers(t, 4)
	reps := startReplicas(t, 3, true, addrs)
	for _, r := range reps {
		waitUntil(t, "peers connected", func() bool { return testutil.ToFloat64(r.a.Metrics.Peers.Live) == 2 })
	}
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Requests through the replica about to go: some fail with it, which is
			// what its clients lose.
			resp, err := http.Post(reps[2].url+"/v1/completions", "application/json", strings.NewReader(promptBody(256, i, 400)))
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	for _, r := range reps[:2] {
		waitUntil(t, "peers import replica 2's bookings", func() bool {
			return testutil.ToFloat64(r.a.Metrics.Peers.BookingsImported) == 6
		})
	}
	reps[2].stop()
	for _, r := range reps[:2] {
		waitUntil(t, "replica 2's bookings dropped", func() bool {
			return testutil.ToFloat64(r.a.Metrics.Peers.BookingsImported) == 0 && len(r.a.Router.PeerBookings()) == 0 &&
				testutil.ToFloat64(r.a.Metrics.Peers.Live) == 1
		})
		v := r.a.Peers.Snapshot()
		if len(v.Peers) != 1 || v.Peers[0].ID == "kvroute-2" {
			t.Fatalf("peers after the kill: %+v", v.Peers)
		}
	}
	wg.Wait()
	for _, r := range reps {
		waitUntil(t, "in-flight back to 0", func() bool { return r.a.Router.InFlight() == 0 })
	}
	// The killed replica's stream ended: dropped at once, not after the silence timeout.
	for _, r := range reps[:2] {
		if got := testutil.ToFloat64(r.a.Metrics.Peers.Expired.WithLabelValues(peers.ExpireStream)); got != 1 {
			t.Fatalf("expired{stream_ended} = %v, want 1", got)
		}
	}
	rec := httptest.NewRecorder()
	reps[0].a.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/debug/peers", nil))
	if body := rec.Body.String(); rec.Code != 200 || !strings.Contains(body, `"enabled": true`) || !strings.Contains(body, `"id": "kvroute-1"`) ||
		strings.Contains(body, `"id": "kvroute-2"`) || !strings.Contains(body, `"bytes_received"`) {
		t.Fatalf("/debug/peers %d: %s", rec.Code, body)
	}
}
