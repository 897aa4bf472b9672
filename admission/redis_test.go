package admission

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/router"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// backends runs body once per budget backend: local, and redis on a real
// redis-server (skipped without one outside CI). newA makes an Admitter of that
// backend; all Admitters one body makes share one Redis key prefix (replicas).
func backends(t *testing.T, body func(t *testing.T, newA func(now func() time.Time, mod func(*config.Admission)) (*Admitter, *metrics.Set))) {
	for _, be := range []string{"local", "redis"} {
		t.Run(be, func(t *testing.T) {
			var addr string
			if be == "redis" {
				addr = startRedis(t).Addr
			}
			prefix := "kvtest:" + newTicket()[:8] + ":"
			body(t, func(now func() time.Time, mod func(*config.Admission)) (*Admitter, *metrics.Set) {
				t.Helper()
				return redisAdmitter(t, be, addr, prefix, now, mod)
			})
		})
	}
}

func redisAdmitter(t *testing.T, be, addr, prefix string, now func() time.Time, mod func(*config.Admission)) (*Admitter, *metrics.Set) {
	t.Helper()
	cfg := config.Default()
	c := &cfg.Admission
	c.Backend = be
	c.Redis.Addr, c.Redis.KeyPrefix = addr, prefix
	c.Redis.Timeout = 2 * time.Second // generous: CI is 2 shared cores; the down tests set their own
	if mod != nil {
		mod(c)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ms := metrics.NewUnregistered()
	a, err := New(Options{Config: *c, Metrics: ms, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a, ms
}

func is429(err error, reason string) bool {
	var re *router.Error
	return errors.As(err, &re) && re.Status == 429 && re.Details == "kvroute_admission_"+reason
}

var okUsage = func(prompt, cached, out int) response.Result {
	return response.Result{Status: 200, Outcome: response.OutcomeOK,
		Usage: response.Usage{Present: true, PromptTokens: prompt, CachedTokens: cached, CachedReported: true, CompletionTokens: out}}
}

// reserveConcurrently starts n reservations at once across as (round robin) and
// returns the grants admitted; every refusal must be a token 429.
func reserveConcurrently(t *testing.T, n int, w Want, id Identity, as ...*Admitter) []*Grant {
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		grants []*Grant
	)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			g, err := as[i%len(as)].Reserve(id, w)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if !is429(err, "tokens") {
					t.Errorf("refusal %v", err)
				}
				return
			}
			grants = append(grants, g)
		}()
	}
	close(start)
	wg.Wait()
	return grants
}

// 200 concurrent requests against a budget of exactly K tokens admit exactly K/cost
// (no overrun, no lost tokens), on both backends; settling each (twice, and Release
// after: once only) leaves the window at exactly the settled cost and no slot held.
func TestBackendsExactBudgetUnderConcurrency(t *testing.T) {
	backends(t, func(t *testing.T, newA func(func() time.Time, func(*config.Admission)) (*Admitter, *metrics.Set)) {
		const per, fit = 150, 37
		a, ms := newA(fixed, func(c *config.Admission) {
			c.Tenants = []config.TenantLimits{{Name: "acme", Limits: config.Limits{TokensPerMinute: per * fit}}}
		})
		id := Identity{Tenant: "acme", Source: "header"}
		grants := reserveConcurrently(t, 200, Want{PromptTokens: 100, CachedTokens: 40, MaxTokens: 50}, id, a)
		if len(grants) != fit {
			t.Fatalf("admitted %d, want %d", len(grants), fit)
		}
		st := a.Snapshot()[0]
		if st.WindowTokens != per*fit || st.Concurrent != fit || st.WindowRequests != fit {
			t.Fatalf("state after reserve %+v", st)
		}
		var wg sync.WaitGroup
		for _, g := range grants {
			wg.Add(1)
			go func() {
				defer wg.Done()
				g.Settle(okUsage(100, 40, 30), -1) // 20 output tokens fewer than reserved
				g.Settle(okUsage(100, 40, 30), -1)
				g.Release()
			}()
		}
		wg.Wait()
		st = a.Snapshot()[0]
		if st.WindowTokens != (per-20)*fit || st.Concurrent != 0 {
			t.Fatalf("state after settle %+v, want %d tokens", st, (per-20)*fit)
		}
		if n := testutil.ToFloat64(ms.Admission.Requests.WithLabelValues("acme", "default", "ok")); n != fit {
			t.Fatalf("settled %v, want %d", n, fit)
		}
		if n := testutil.ToFloat64(ms.Admission.BackendErrors.WithLabelValues("reserve")); n != 0 {
			t.Fatalf("backend errors %v", n)
		}
	})
}

// Two kvroute replicas (two Admitters) on one Redis share one budget: 200 concurrent
// requests split across them admit exactly what fits in total; either replica sees
// the shared state, and a ticket settled by one cannot be settled again by the other.
func TestRedisReplicasShareOneBudget(t *testing.T) {
	srv := startRedis(t)
	const per, fit = 150, 23
	mod := func(c *config.Admission) {
		c.Tenants = []config.TenantLimits{{Name: "acme", Limits: config.Limits{TokensPerMinute: per * fit, MaxConcurrent: 1000}}}
		c.Redis.Replicas = 2
	}
	a1, _ := redisAdmitter(t, "redis", srv.Addr, "kvtest:share:", fixed, mod)
	a2, _ := redisAdmitter(t, "redis", srv.Addr, "kvtest:share:", fixed, mod)
	id := Identity{Tenant: "acme"}
	grants := reserveConcurrently(t, 200, Want{PromptTokens: 100, CachedTokens: 40, MaxTokens: 50}, id, a1, a2)
	if len(grants) != fit {
		t.Fatalf("admitted %d across two replicas, want %d", len(grants), fit)
	}
	var by1 int
	for _, g := range grants {
		if g.a == a1 {
			by1++
		}
	}
	if by1 == 0 || by1 == fit {
		t.Logf("all admissions on one replica (%d of %d): still one budget", by1, fit)
	}
	if s1, s2 := a1.Snapshot()[0], a2.Snapshot()[0]; s1.WindowTokens != per*fit || s2.WindowTokens != per*fit || s2.Concurrent != fit {
		t.Fatalf("shared state %+v / %+v", s1, s2)
	}
	// Settle every grant on its replica, then replay each ticket's settlement on the
	// other replica's backend: the ticket key makes the replay a no-op.
	for _, g := range grants {
		g.Settle(okUsage(100, 40, 0), -1) // 50 fewer
		other := a1
		if g.a == a1 {
			other = a2
		}
		if err := other.budget.settle(g.res, 0, fixed()); err != nil {
			t.Fatal(err)
		}
	}
	if s := a1.Snapshot()[0]; s.WindowTokens != (per-50)*fit || s.Concurrent != 0 {
		t.Fatalf("after settle (and replays) %+v, want %d", s, (per-50)*fit)
	}
}

// An aborted request pays its prompt and what was streamed before the abort, on both
// backends; a failed one that streamed nothing pays its prompt.
func TestBackendsSettleAfterAbort(t *testing.T) {
	backends(t, func(t *testing.T, newA func(func() time.Time, func(*config.Admission)) (*Admitter, *metrics.Set)) {
		a, ms := newA(fixed, func(c *config.Admission) {
			c.Default = config.Limits{TokensPerMinute: 100000}
			c.DefaultOutputTokens = 500
		})
		id := Identity{Tenant: "t"}
		g, err := a.Reserve(id, Want{PromptTokens: 1000, CachedTokens: 200})
		if err != nil || g.Reserved() != 1500 {
			t.Fatalf("%v %d", err, g.Reserved())
		}
		if !g.CountsTokens() {
			t.Fatal("a budgeted tenant's stream must be counted")
		}
		g.Settle(response.Result{Status: 200, Outcome: response.OutcomeAborted}, 7)
		if s := a.Snapshot()[0]; s.WindowTokens != 1007 || s.Concurrent != 0 {
			t.Fatalf("aborted after 7 tokens: %+v, want 1007", s)
		}
		g, _ = a.Reserve(id, Want{PromptTokens: 1000})
		g.Settle(response.Result{Status: 502, Outcome: response.OutcomeUpstreamError}, 0)
		if s := a.Snapshot()[0]; s.WindowTokens != 2007 {
			t.Fatalf("failed: %+v", s)
		}
		if testutil.ToFloat64(ms.Admission.Settlements.WithLabelValues("counted")) != 2 {
			t.Fatal("usage_source counted")
		}
	})
}

// Token limits over any window list (minute and day here), and per tenant × model,
// checked in one step, on both backends; the refusal names the window and model and
// its headers report the refusing limit.
func TestBackendsWindowsAndModelLimits(t *testing.T) {
	backends(t, func(t *testing.T, newA func(func() time.Time, func(*config.Admission)) (*Admitter, *metrics.Set)) {
		clk := &clock{t: fixed()}
		a, _ := newA(clk.now, func(c *config.Admission) {
			c.DefaultOutputTokens = 100
			c.Tenants = []config.TenantLimits{{Name: "acme",
				Limits: config.Limits{TokensPerMinute: 600, TokenWindows: []config.TokenWindow{{Window: 24 * time.Hour, Tokens: 1000}}},
				Models: []config.ModelLimits{{Model: "m1", TokensPerMinute: 300}}}}
		})
		id := Identity{Tenant: "acme"}
		w := func(model string) Want { return Want{PromptTokens: 100, Model: model} } // cost 200
		if _, err := a.Reserve(id, w("m1")); err != nil {
			t.Fatal(err)
		}
		_, err := a.Reserve(id, w("m1"))
		var re *router.Error
		if !errors.As(err, &re) || !is429(err, "tokens") || !strings.Contains(re.Message, "300 per minute for model m1") {
			t.Fatalf("model m1 limit: %v", err)
		}
		for range 2 {
			if _, err := a.Reserve(id, w("m2")); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := a.Reserve(id, w("m2")); !is429(err, "tokens") {
			t.Fatalf("minute limit: %v", err)
		}
		clk.add(time.Minute) // minute fresh, day at 600
		for range 2 {
			if _, err := a.Reserve(id, w("m2")); err != nil {
				t.Fatal(err)
			}
		}
		_, err = a.Reserve(id, w("m1"))
		if !errors.As(err, &re) || !strings.Contains(re.Message, "0 of 1000 per day remain") {
			t.Fatalf("day limit: %v", err)
		}
		h := map[string]string{}
		for _, kv := range re.Header {
			h[kv[0]] = kv[1]
		}
		// fixed() is 12:00:30 UTC, +1m: the day ends in 11h58m30s.
		if h["x-ratelimit-limit-tokens"] != "1000" || h["x-ratelimit-remaining-tokens"] != "0" || h["x-ratelimit-reset-tokens"] != "11h58m30s" {
			t.Fatalf("day refusal headers %v", h)
		}
	})
}

// Redis killed mid-run: every tenant gets its redis_down mode, counted — local (1/N of
// the budget in memory, N = admission.redis.replicas), fail_open, fail_closed (503) —
// and a hung Redis (SIGSTOP) is bounded by admission.redis.timeout. When Redis is back
// and retry_interval passed, reservations go to Redis again (the restarted server has
// no scripts cached: EVALSHA answers NOSCRIPT and the client falls back to EVAL).
func TestRedisDownModes(t *testing.T) {
	srv := startRedis(t)
	clk := &clock{t: fixed()}
	a, ms := redisAdmitter(t, "redis", srv.Addr, "kvtest:down:", clk.now, func(c *config.Admission) {
		c.Redis.Replicas = 2
		c.Redis.Timeout = 200 * time.Millisecond
		c.Redis.Down = "local"
		c.Default = config.Limits{RequestsPerMinute: 10}
		c.Tenants = []config.TenantLimits{
			{Name: "open", Limits: config.Limits{RequestsPerMinute: 10, RedisDown: "fail_open"}},
			{Name: "closed", Limits: config.Limits{RequestsPerMinute: 10, RedisDown: "fail_closed"}},
		}
	})
	var before []*Grant
	for _, tn := range []string{"local", "open", "closed"} {
		g, err := a.Reserve(Identity{Tenant: tn}, Want{PromptTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		before = append(before, g)
	}
	srv.kill()

	// fail_closed: 503 with Retry-After.
	_, err := a.Reserve(Identity{Tenant: "closed"}, Want{PromptTokens: 10})
	var re *router.Error
	if !errors.As(err, &re) || re.Status != 503 || re.RetryAfter != time.Second {
		t.Fatalf("fail_closed: %v", err)
	}
	// fail_open: admitted past the limit, unbudgeted.
	for i := range 20 {
		g, err := a.Reserve(Identity{Tenant: "open"}, Want{PromptTokens: 10})
		if err != nil {
			t.Fatalf("fail_open request %d: %v", i, err)
		}
		g.Settle(okUsage(10, 0, 1), -1)
	}
	// local: 10 requests per minute / 2 replicas = 5 in this replica's memory.
	var local []*Grant
	for range 5 {
		g, err := a.Reserve(Identity{Tenant: "local"}, Want{PromptTokens: 10})
		if err != nil {
			t.Fatalf("local fallback: %v", err)
		}
		local = append(local, g)
	}
	if _, err := a.Reserve(Identity{Tenant: "local"}, Want{PromptTokens: 10}); !is429(err, "requests") {
		t.Fatalf("local fallback beyond 1/N: %v", err)
	}
	if s := a.Snapshot(); len(s) != 1 || s[0].Backend != "local_fallback" || s[0].WindowRequests != 5 || s[0].Limits.RequestsPerMinute != 10 {
		t.Fatalf("snapshot while down %+v", s)
	}
	for _, g := range local {
		g.Settle(okUsage(10, 0, 1), -1) // settles in the fallback, not Redis
	}
	for _, g := range before {
		g.Settle(okUsage(10, 0, 1), -1) // Redis down: the settlement fails, counted
	}
	for mode, n := range map[string]float64{"fail_closed": 1, "fail_open": 20, "local": 6} {
		if got := testutil.ToFloat64(ms.Admission.BackendDown.WithLabelValues(mode)); got != n {
			t.Fatalf("backend_down{mode=%s} = %v, want %v", mode, got, n)
		}
	}
	// One failed reserve opened the down spell (no more calls until retry_interval),
	// and each settlement of a Redis ticket was tried and failed (and is being retried:
	// at least 3).
	if r, s := testutil.ToFloat64(ms.Admission.BackendErrors.WithLabelValues("reserve")), testutil.ToFloat64(ms.Admission.BackendErrors.WithLabelValues("settle")); r != 1 || s < 3 {
		t.Fatalf("backend errors reserve %v settle %v, want 1 and ≥ 3", r, s)
	}

	// Back up: after retry_interval, Redis decides again (fresh server, empty budget).
	srv.restart(t)
	clk.add(2 * time.Second)
	g, err := a.Reserve(Identity{Tenant: "closed"}, Want{PromptTokens: 10})
	if err != nil || g.res.via != a.budget {
		t.Fatalf("after recovery: %v (via %T)", err, g.res.via)
	}
	g.Settle(okUsage(10, 0, 1), -1)

	// Hung Redis: the call times out (admission.redis.timeout), the mode applies.
	if err := srv.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer srv.cmd.Process.Signal(syscall.SIGCONT)
	if _, err := a.Reserve(Identity{Tenant: "closed"}, Want{PromptTokens: 10}); !errors.As(err, &re) || re.Status != 503 {
		t.Fatalf("hung redis, fail_closed: %v", err)
	}
	if r := testutil.ToFloat64(ms.Admission.BackendErrors.WithLabelValues("reserve")); r != 2 {
		t.Fatalf("hung redis: reserve errors %v, want 2", r)
	}
}

// The output estimate is min(max_tokens, learned p90 of the tenant × model) once
// min_samples settled (reported or counted, completed) outputs are held, the default
// before; aborted requests do not teach it; the key count is bounded.
func TestLearnedOutputEstimate(t *testing.T) {
	a, _ := newAdmitter(t, func(c *config.Admission) {
		c.DefaultOutputTokens = 1000
		c.OutputHistory = config.OutputHistory{Samples: 16, MinSamples: 8, MaxKeys: 4}
	})
	id := Identity{Tenant: "t"}
	w := Want{PromptTokens: 10, Model: "m"}
	for i := 1; i <= 10; i++ {
		g, _ := a.Reserve(id, w)
		if i <= 8 && g.Reserved() != 1010 {
			t.Fatalf("request %d before history: reserved %d, want 1010", i, g.Reserved())
		}
		g.Settle(okUsage(10, 0, 10*i), -1)
		g, _ = a.Reserve(id, w)
		g.Settle(response.Result{Outcome: response.OutcomeAborted}, 5000) // not learned
	}
	// outputs 10..100: nearest-rank p90 of 10 samples is the 9th smallest, 90.
	if g, _ := a.Reserve(id, w); g.Reserved() != 100 {
		t.Fatalf("learned: reserved %d, want 10+90", g.Reserved())
	}
	if g, _ := a.Reserve(id, Want{PromptTokens: 10, Model: "m", MaxTokens: 50}); g.Reserved() != 60 {
		t.Fatalf("max_tokens caps: %d", g.Reserved())
	}
	if g, _ := a.Reserve(id, Want{PromptTokens: 10, Model: "other"}); g.Reserved() != 1010 {
		t.Fatalf("another model has no history: %d", g.Reserved())
	}
	for i := range 10 {
		g, _ := a.Reserve(Identity{Tenant: "x" + string(rune('a'+i))}, w)
		g.Settle(okUsage(1, 0, 1), -1)
	}
	if n := a.hist.len(); n != 4 {
		t.Fatalf("history keys %d, want the bound 4", n)
	}
}

// A Redis stall (SIGSTOP, then SIGCONT) mid-request leaks no concurrency slot: the
// settlements that failed during it are retried until Redis applies them, and a
// reservation whose reply was lost (Redis runs it when it resumes) is cancelled by its
// ticket. After the stall, a tenant with max_concurrent 5 gets all 5 slots back, long
// before ticket_ttl (1 h). One log line says Redis went down, one that it recovered,
// however many calls failed between. Polls with a generous deadline; nothing is timed.
func TestRedisStallLeaksNoSlot(t *testing.T) {
	logs := captureLog(t)
	srv := startRedis(t)
	const prefix = "kvtest:stall:"
	a, ms := redisAdmitter(t, "redis", srv.Addr, prefix, nil, func(c *config.Admission) {
		c.Redis.Timeout = 200 * time.Millisecond
		c.Redis.RetryInterval = 100 * time.Millisecond
		c.Redis.Down = "fail_closed"
		c.Default = config.Limits{MaxConcurrent: 5}
	})
	id := Identity{Tenant: "t"}
	var gs []*Grant
	for range 5 {
		g, err := a.Reserve(id, Want{PromptTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	if _, err := a.Reserve(id, Want{PromptTokens: 10}); !is429(err, "concurrency") {
		t.Fatalf("6th of max_concurrent 5: %v", err)
	}
	if err := srv.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cont := func() { _ = srv.cmd.Process.Signal(syscall.SIGCONT) }
	defer cont()
	// Sent to the stalled server: the client times out, Redis runs it on resume.
	var re *router.Error
	if _, err := a.Reserve(id, Want{PromptTokens: 10}); !errors.As(err, &re) || re.Status != 503 {
		t.Fatalf("stalled redis, fail_closed: %v", err)
	}
	for _, g := range gs {
		g.Settle(okUsage(10, 0, 1), -1) // fails during the stall: queued for retry
	}
	if s := testutil.ToFloat64(ms.Admission.BackendErrors.WithLabelValues("settle")); s < 1 {
		t.Fatalf("settle errors during the stall %v, want ≥ 1", s)
	}
	cont()

	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	key := prefix + "{t}:conc"
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n, err := c.ZCard(context.Background(), key).Result()
		if err == nil && n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("leases still held 60 s after the stall: %d (%v)", n, err)
		}
	}
	// Redis counted as down for retry_interval after the last failure: wait it out.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if !a.budget.(*redisBackend).down(time.Now()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("redis still counted as down")
		}
	}
	for i := range 5 {
		if _, err := a.Reserve(id, Want{PromptTokens: 10}); err != nil {
			t.Fatalf("slot %d of 5 after the stall: %v", i+1, err)
		}
	}
	if _, err := a.Reserve(id, Want{PromptTokens: 10}); !is429(err, "concurrency") {
		t.Fatalf("6th after the stall: %v", err)
	}
	text := logs.String()
	if d, u := strings.Count(text, "redis budget backend down"), strings.Count(text, "redis budget backend recovered"); d != 1 || u != 1 {
		t.Fatalf("log lines: %d down, %d recovered, want one each:\n%s", d, u, text)
	}
	if !strings.Contains(text, "level=WARN") || !strings.Contains(text, "addr="+srv.Addr) {
		t.Fatalf("the down line is a warning naming the address:\n%s", text)
	}
}

// captureLog sends the default slog logger to a buffer for the test.
func captureLog(t *testing.T) *lockedBuffer {
	t.Helper()
	b := &lockedBuffer{}
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(b, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	return b
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
