//go:build soak

package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// TestSoakTrust (make soak-trust, SOAK=2m; default 1h) drives mixed traffic through
// kvroute proxy on loopback with the redis budget backend on a real redis-server that
// is stopped (SIGSTOP) for 2 s every 20 s, abort storms (a third of the clients hang up
// mid-stream or mid-upload), guessed API keys from the same address, and oversize
// bodies. At the end it prints one JSON object: heap and goroutines before and after,
// leases this replica still holds, leases left in Redis, and the minute budget's
// charge against its limit. It fails if a lease is left or goroutines grew.
func TestSoakTrust(t *testing.T) {
	d := time.Hour
	if s := os.Getenv("SOAK"); s != "" {
		v, err := time.ParseDuration(s)
		if err != nil || v <= 0 {
			t.Fatalf("SOAK=%q", s)
		}
		d = v
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed")
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	raddr := l.Addr().String()
	l.Close()
	rs := exec.Command(bin, "--port", strings.Split(raddr, ":")[1], "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := rs.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rs.Process.Signal(syscall.SIGCONT); _ = rs.Process.Kill(); _ = rs.Wait() }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", raddr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("redis-server did not start")
		}
	}

	fleet := newSoakFleet()
	defer fleet.close()
	ms := metrics.NewUnregistered()
	// The default policy, built as the app builds it (app.newPolicy).
	policy := func(ms *metrics.Set) scoring.Policy {
		dc := config.Default()
		o := dc.Scoring.Options()
		o.Metrics = ms.Scoring
		p, err := scoring.New(dc.Scoring.Policy, o)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	r := router.New(router.Options{Registry: fleet.reg, Models: []router.Model{{Name: "m"}}, Metrics: ms, Policy: policy(ms)})
	// The peers exchange with a token, and one honest peer replica routing a twelfth
	// of the traffic over the same workers (soak_peer_test.go).
	pctx, pstop := context.WithCancel(context.Background())
	defer pstop()
	me := startSoakReplica(t, pctx, "under-test", r, ms)
	ms2 := metrics.NewUnregistered()
	r2 := router.New(router.Options{Registry: fleet.reg, Models: []router.Model{{Name: "m"}}, Metrics: ms2, Policy: policy(ms2)})
	honest := startSoakReplica(t, pctx, "honest", r2, ms2)
	me.dial(honest.addr)
	honest.dial(me.addr)
	for deadline := time.Now().Add(30 * time.Second); len(me.m.Snapshot().Peers) != 1 || len(honest.m.Snapshot().Peers) != 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the replicas did not exchange summaries")
		}
	}
	keys := apiKeyFile(t, "sk-a", "alpha")
	c := config.Default().Admission
	c.Identity, c.APIKeysFile, c.RequireTenant = []string{"api_key"}, keys, true
	c.Backend, c.Redis.Addr, c.Redis.KeyPrefix = "redis", raddr, "soak:"
	c.Redis.Timeout, c.Redis.RetryInterval, c.Redis.LeaseTTL = 200*time.Millisecond, 500*time.Millisecond, 3*time.Second
	c.Default = config.Limits{TokensPerMinute: 200000, MaxConcurrent: 64}
	c.AuthThrottle = config.AuthThrottle{Failures: 1000, Window: time.Second, MaxClients: 16} // one client address here: exercised, rarely refusing
	adm, err := admission.New(admission.Options{Config: c, Metrics: ms})
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	ext := config.Default().ExtProc
	ext.MaxBodyBytes = 64 << 10
	upstream := &http.Transport{MaxIdleConnsPerHost: 256}
	srv := httptest.NewServer(New(Options{Router: r, Config: ext, Metrics: ms, Admission: adm, BodyTimeout: 10 * time.Second, Transport: upstream}))
	defer srv.Close()
	upstream2 := &http.Transport{MaxIdleConnsPerHost: 64}
	srv2 := httptest.NewServer(New(Options{Router: r2, Config: ext, Metrics: ms2, BodyTimeout: 10 * time.Second, Transport: upstream2}))
	defer srv2.Close()

	runtime.GC()
	var m0 runtime.MemStats
	runtime.ReadMemStats(&m0)
	g0 := runtime.NumGoroutine()

	ctx, stop := context.WithTimeout(context.Background(), d)
	defer stop()
	var stalls atomic.Int64
	go func() { // Redis stalls
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Second):
			}
			_ = rs.Process.Signal(syscall.SIGSTOP)
			stalls.Add(1)
			time.Sleep(2 * time.Second)
			_ = rs.Process.Signal(syscall.SIGCONT)
		}
	}()
	var attack soakAttack
	attacked := make(chan struct{})
	go func() { defer close(attacked); me.attack(ctx, &attack, fleet) }()
	var sent atomic.Int64
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				sent.Add(1)
				switch i % 12 {
				case 0: // a guessed key
					soakPost(client, srv.URL, `{"model":"m","messages":[{"role":"user","content":"x"}]}`, "sk-guess", 0)
				case 1: // oversize
					soakPost(client, srv.URL, `{"model":"m","prompt":"`+strings.Repeat("x", 70<<10)+`"}`, "sk-a", 0)
				case 2, 3, 4: // abort mid-stream
					soakPost(client, srv.URL, `{"model":"m","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"x"}]}`, "sk-a", time.Millisecond)
				case 5: // abort mid-upload
					if c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://")); err == nil {
						fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-a\r\nContent-Length: 500\r\n\r\n{\"model\"")
						c.Close()
					}
				case 11: // through the honest peer replica
					soakPost(client, srv2.URL, `{"model":"m","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"hello"}]}`, "", 0)
				default:
					soakPost(client, srv.URL, `{"model":"m","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"hello"}]}`, "sk-a", 0)
				}
			}
		}()
	}
	wg.Wait()
	<-attacked
	_ = rs.Process.Signal(syscall.SIGCONT)
	client.CloseIdleConnections()
	// Leave the retry queue and the last leases time to drain (lease_ttl 3 s).
	var held float64
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if held = testutil.ToFloat64(ms.Admission.RedisLeases); held == 0 && r.InFlight() == 0 {
			break
		}
	}
	time.Sleep(2 * c.Redis.LeaseTTL)
	// Every hostile peer is gone: only the honest one's state is left, nothing in flight.
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if len(me.m.Snapshot().Peers) == 1 && testutil.ToFloat64(ms.Peers.InboundBytes) == 0 {
			break
		}
	}
	rc, _ := net.Dial("tcp", raddr)
	fmt.Fprintf(rc, "ZCARD soak:{alpha}:conc\r\n")
	buf := make([]byte, 64)
	n, _ := rc.Read(buf)
	rc.Close()
	inRedis, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(string(buf[:n]), ":")))
	var charged int64
	for _, s := range adm.Snapshot() {
		if s.Tenant == "alpha" && s.Backend == "redis" {
			charged = s.WindowTokens
		}
	}
	// Keep-alive pools are not leaks: close them before counting goroutines.
	upstream.CloseIdleConnections()
	upstream2.CloseIdleConnections()
	srv.CloseClientConnections()
	srv2.CloseClientConnections()
	for _, s := range fleet.servers {
		s.CloseClientConnections()
	}
	runtime.GC()
	var m1 runtime.MemStats
	runtime.ReadMemStats(&m1)
	time.Sleep(time.Second)
	g1 := runtime.NumGoroutine()
	report := map[string]any{
		"duration": d.String(), "requests": sent.Load(), "redis_stalls": stalls.Load(),
		"heap_bytes_before": m0.HeapAlloc, "heap_bytes_after": m1.HeapAlloc,
		"goroutines_before": g0, "goroutines_after": g1,
		"leases_held": held, "leases_in_redis": inRedis, "in_flight": r.InFlight(),
		"budget_window_tokens": charged, "budget_limit_tokens_per_minute": c.Default.TokensPerMinute,
		"budget_overrun_tokens": max(0, charged-c.Default.TokensPerMinute),
		"auth_throttled":        testutil.ToFloat64(ms.Admission.AuthThrottled),
		"aborted_no_reply":      testutil.ToFloat64(ms.ExtProc.ProxyRequests.WithLabelValues("error", "aborted")),
		"backend_errors": map[string]float64{"reserve": testutil.ToFloat64(ms.Admission.BackendErrors.WithLabelValues("reserve")),
			"settle": testutil.ToFloat64(ms.Admission.BackendErrors.WithLabelValues("settle")), "renew": testutil.ToFloat64(ms.Admission.BackendErrors.WithLabelValues("renew"))},
	}
	pr := me.report(fleet, &attack)
	for k, v := range pr {
		report[k] = v
	}
	out, _ := json.Marshal(report)
	fmt.Println(string(out))
	if held != 0 || inRedis != 0 || r.InFlight() != 0 {
		t.Fatalf("leaked: %s", out)
	}
	if share := pr["attacked_share"].(float64); share <= 0 || share >= 1 {
		t.Fatalf("attacked worker's share %v: starved or drawing everything", share)
	}
	if ib := testutil.ToFloat64(ms.Peers.InboundBytes); ib != 0 {
		t.Fatalf("peers inbound bytes %v held when idle", ib)
	}
	if attack.forgedHeld.Load() != 0 {
		t.Fatalf("a peer without the token held a peer state (%d samples)", attack.forgedHeld.Load())
	}
	if g1 > g0+20 {
		t.Fatalf("goroutines %d → %d", g0, g1)
	}
}

// soakPost sends one request; abortAfter > 0 cancels it that long after the headers.
func soakPost(c *http.Client, base, body, key string, abortAfter time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := c.Do(req)
	if err != nil {
		return
	}
	if abortAfter > 0 {
		time.Sleep(abortAfter)
		cancel()
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}
