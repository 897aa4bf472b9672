//go:build soak

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/kvindex/kvevents"
	"github.com/kvroute/kvroute/kvindex/kvtest"
)

// The soak (make soak; RELIABILITY.md) drives KVROUTE_SOAK_REQUESTS requests (default
// 1,000,000) through each front, kvroute proxy and the Envoy stand-in (BUFFERED), with 10 %
// of clients aborting mid-stream, one worker killed and restarted on its address every
// 2 % of the run, and a KV event flood on every worker's real ZMQ socket. It asserts that
// no ticket is left in flight (without the TTL sweep: router.ticket_ttl is an hour), and
// that goroutines and RSS stay bounded, and logs the figures.

func soakRequests(t *testing.T) int {
	n := 1_000_000
	if s := os.Getenv("KVROUTE_SOAK_REQUESTS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 {
			t.Fatalf("KVROUTE_SOAK_REQUESTS=%q", s)
		}
		n = v
	}
	return n
}

func rssBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return -1
}

// restartable serves w on a fixed address and can be killed (listener and every
// connection closed, like a crashed engine) and started again on the same address.
type restartable struct {
	w    *testWorker
	addr string
	mu   sync.Mutex
	srv  *http.Server
}

func (r *restartable) start(t *testing.T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ln net.Listener
	var err error
	for i := 0; i < 100; i++ { // the old socket may linger for a moment
		if ln, err = net.Listen("tcp", r.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("restart %s: %v", r.addr, err)
	}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.w.serve)}
	go r.srv.Serve(ln)
}

func (r *restartable) kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.srv.Close()
}

func TestSoak(t *testing.T) {
	n := soakRequests(t)
	for _, front := range []struct {
		name  string
		proxy bool
	}{{"proxy", true}, {"standin", false}} {
		t.Run(front.name, func(t *testing.T) { soak(t, n, front.proxy) })
	}
}

func soak(t *testing.T, n int, proxy bool) {
	var pubs []*kvtest.Publisher
	var rs []*restartable
	f := newFixture(t, fixtureOpts{workers: 3, proxy: proxy, envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed},
		setup: func(ws []*testWorker) {
			for _, w := range ws {
				addr := w.addr()
				w.srv.Close() // the worker now runs on a restartable server at the same address
				r := &restartable{w: w, addr: addr}
				r.start(t)
				rs = append(rs, r)
			}
		},
		cfg: func(c *config.Config) {
			c.Router.TicketTTL = time.Hour // a leak must show as in-flight, not be swept
			c.Scoring.Scrape.Interval = 200 * time.Millisecond
			c.Models = []config.Model{{Name: "m", BlockSize: 16}}
			for i := range c.Workers {
				p, err := kvtest.New(kvtest.Options{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(p.Close)
				pubs = append(pubs, p)
				c.Workers[i].KVEvents = config.WorkerKVEvents{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint()}
			}
		}})
	defer func() {
		for _, r := range rs {
			r.kill()
		}
	}()
	runtime.GC()
	baseG, baseRSS := runtime.NumGoroutine(), rssBytes()

	// KV event flood: batches of 32 BlockStored on every worker's socket until the end.
	stop := make(chan struct{})
	var events atomic.Int64
	var floodWG sync.WaitGroup
	for _, p := range pubs {
		floodWG.Add(1)
		go func(p *kvtest.Publisher) {
			defer floodWG.Done()
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
			toks := make([]uint32, 16)
			for {
				select {
				case <-stop:
					return
				default:
				}
				evs := make([]kvevents.Event, 32)
				for i := range evs {
					evs[i] = kvevents.Event{Type: kvevents.TypeBlockStored, BlockHashes: []kvevents.Hash{kvevents.Uint(rng.Uint64())},
						TokenIDs: toks, BlockSize: 16, Medium: "GPU", SpecKind: "full_attention"}
				}
				if _, err := p.Publish(&kvevents.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: evs, HasDPRank: true}); err == nil {
					events.Add(int64(len(evs)))
				}
				time.Sleep(time.Millisecond)
			}
		}(p)
	}

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var next, ok, aborted, refused, kills atomic.Int64
	var peakG atomic.Int64
	var peakRSS atomic.Int64
	start := time.Now()
	// Worker kill/restart: every 2 s one worker (in turn) dies and comes back 300 ms later.
	killerDone := make(chan struct{})
	go func() {
		defer close(killerDone)
		tk := time.NewTicker(2 * time.Second)
		defer tk.Stop()
		for k := 0; ; k++ {
			select {
			case <-stop:
				return
			case <-tk.C:
			}
			r := rs[k%len(rs)]
			r.kill()
			kills.Add(1)
			time.Sleep(300 * time.Millisecond)
			r.start(t)
		}
	}()
	const conc = 32
	var wg sync.WaitGroup
	for c := 0; c < conc; c++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 2))
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				if i%1000 == 0 {
					if g := int64(runtime.NumGoroutine()); g > peakG.Load() {
						peakG.Store(g)
					}
					if m := rssBytes(); m > peakRSS.Load() {
						peakRSS.Store(m)
					}
				}
				abort := rng.IntN(10) == 0
				ctx, cancel := context.WithCancel(context.Background())
				req, _ := http.NewRequestWithContext(ctx, "POST", f.url+"/v1/chat/completions", strings.NewReader(chatStream))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					cancel()
					refused.Add(1)
					continue
				}
				if abort { // read the first event, then hang up mid-stream
					bufio.NewReader(resp.Body).ReadString('\n')
					cancel()
					resp.Body.Close()
					aborted.Add(1)
					continue
				}
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				cancel()
				if err == nil && resp.StatusCode == 200 {
					ok.Add(1)
				} else {
					refused.Add(1)
				}
			}
		}(uint64(c) + 1)
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stop)
	floodWG.Wait()
	<-killerDone // every worker is up again
	deadline := time.Now().Add(60 * time.Second)
	for f.app.Router.InFlight() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d tickets leaked in flight after the soak", f.app.Router.InFlight())
		}
		time.Sleep(50 * time.Millisecond)
	}
	client.CloseIdleConnections()
	// Goroutines settle to the base plus the idle keep-alive pools (client → front, front
	// → workers: a few goroutines per pooled connection, at most ~conc per pool): a bound
	// set by the concurrency, not by the number of requests.
	gBound := baseG + 16*conc
	var endG int
	for i := 0; i < 100; i++ {
		runtime.GC()
		if endG = runtime.NumGoroutine(); endG <= gBound {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	endRSS := rssBytes()
	t.Logf("soak %s: %d requests in %s (%.0f req/s): ok %d, client aborts %d, refused/failed %d (worker kills %d); KV events published %d; in flight after: 0; goroutines base %d peak %d end %d; RSS base %d MiB peak %d MiB end %d MiB",
		map[bool]string{true: "proxy", false: "stand-in"}[proxy], n, elapsed.Round(time.Second), float64(n)/elapsed.Seconds(), ok.Load(), aborted.Load(), refused.Load(), kills.Load(),
		events.Load(), baseG, peakG.Load(), endG, baseRSS>>20, peakRSS.Load()>>20, endRSS>>20)
	if endG > gBound {
		t.Errorf("goroutines grew from %d to %d (bound %d)", baseG, endG, gBound)
	}
	if peakRSS.Load() > 2<<30 {
		t.Errorf("RSS peaked at %d MiB (bound 2 GiB)", peakRSS.Load()>>20)
	}
	if ok.Load() < int64(n)/2 {
		t.Errorf("only %d of %d requests completed", ok.Load(), n)
	}
	_ = fmt.Sprint
}
