package admission

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/kvroute/kvroute/config"
)

func newClock() *clock { return &clock{t: fixed()} }

func leaseAdmitter(t *testing.T, addr, prefix string, c *clock, mod func(*config.Admission)) (*Admitter, *redisBackend) {
	t.Helper()
	a, _ := redisAdmitter(t, "redis", addr, prefix, c.now, func(cf *config.Admission) {
		cf.Default = config.Limits{MaxConcurrent: 3}
		cf.Redis.LeaseTTL = 30 * time.Second
		if mod != nil {
			mod(cf)
		}
	})
	return a, a.budget.(*redisBackend)
}

// A reservation's slot lasts admission.redis.lease_ttl unless its replica renews it,
// not ticket_ttl (1 h): a replica that dies mid-request (its requests never settle)
// gives its slots back to the other replicas 30 s later; one that lives renews them
// for as long as its requests are in flight, and a settled one is not renewed.
func TestRedisLeaseLivesWithItsRequest(t *testing.T) {
	srv := startRedis(t)
	const prefix = "kvtest:lease:"
	id := Identity{Tenant: "t"}
	ca, cb := newClock(), newClock()
	a, ra := leaseAdmitter(t, srv.Addr, prefix, ca, nil)
	b, _ := leaseAdmitter(t, srv.Addr, prefix, cb, nil)
	var gs []*Grant
	for range 3 {
		g, err := a.Reserve(id, Want{PromptTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	if ra.leases.Len() != 3 || testutil.ToFloat64(a.m.RedisLeases) != 3 {
		t.Fatalf("leases held %d (gauge %v), want 3", ra.leases.Len(), testutil.ToFloat64(a.m.RedisLeases))
	}
	// Alive: renewed at +20 s, so at +40 s (past the first lease's end) still held.
	ca.add(20 * time.Second)
	if n := ra.renew(ca.now()); n != 3 {
		t.Fatalf("renewed %d, want 3", n)
	}
	cb.add(40 * time.Second)
	if _, err := b.Reserve(id, Want{PromptTokens: 10}); !is429(err, "concurrency") {
		t.Fatalf("replica b at +40 s with 3 renewed leases: %v, want concurrency 429", err)
	}
	gs[0].Settle(okUsage(10, 0, 1), -1) // settled: slot back at once, never renewed again
	if ra.leases.Len() != 2 {
		t.Fatalf("leases held after one settle: %d", ra.leases.Len())
	}
	if g, err := b.Reserve(id, Want{PromptTokens: 10}); err != nil {
		t.Fatalf("slot of the settled request: %v", err)
	} else {
		g.Settle(okUsage(10, 0, 1), -1)
	}
	// Dies: a's last two requests never settle and nobody renews them.
	a.Close()
	cb.add(9 * time.Second) // +49 s: renewed to +50 s, still held
	if _, err := b.Reserve(id, Want{PromptTokens: 10}); err != nil {
		t.Fatalf("one slot free at +49 s: %v", err)
	}
	if _, err := b.Reserve(id, Want{PromptTokens: 10}); !is429(err, "concurrency") {
		t.Fatalf("dead replica's leases until +50 s: %v", err)
	}
	cb.add(2 * time.Second) // +51 s: past lease_ttl after the last renewal
	for i := range 2 {
		if _, err := b.Reserve(id, Want{PromptTokens: 10}); err != nil {
			t.Fatalf("slot %d of the dead replica after lease_ttl: %v", i+1, err)
		}
	}
}

// A Redis stall (SIGSTOP, SIGCONT) while requests are in flight: renewals fail during
// it (counted, Redis is down), the leases survive a stall shorter than lease_ttl and
// are renewed after it; if the replica dies during the stall, its slots come back
// lease_ttl after their last renewal, not after ticket_ttl.
func TestRedisStallThenReplicaDeathFreesLeasesAtLeaseTTL(t *testing.T) {
	srv := startRedis(t)
	const prefix = "kvtest:leasestall:"
	id := Identity{Tenant: "t"}
	ca, cb := newClock(), newClock()
	fast := func(c *config.Admission) {
		c.Redis.Timeout, c.Redis.RetryInterval = 200*time.Millisecond, 100*time.Millisecond
	}
	a, ra := leaseAdmitter(t, srv.Addr, prefix, ca, fast)
	b, _ := leaseAdmitter(t, srv.Addr, prefix, cb, fast)
	for range 3 {
		if _, err := a.Reserve(id, Want{PromptTokens: 10}); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cont := func() { _ = srv.cmd.Process.Signal(syscall.SIGCONT) }
	defer cont()
	ca.add(10 * time.Second)
	if n := ra.renew(ca.now()); n != 0 || testutil.ToFloat64(a.m.BackendErrors.WithLabelValues("renew")) != 1 {
		t.Fatalf("renew during the stall: %d renewed, %v errors", n, testutil.ToFloat64(a.m.BackendErrors.WithLabelValues("renew")))
	}
	cont()
	ca.add(10 * time.Second) // +20 s: past retry_interval; the leases (to +30 s) survived the stall
	if ra.down(ca.now()) {
		t.Fatal("redis still counted as down past retry_interval")
	}
	// Redis answers again once it has worked through what queued during the stall.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if n := ra.renew(ca.now()); n == 3 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("renewed after the stall: %d, want 3", n)
		}
		ca.add(200 * time.Millisecond) // past the down spell (retry_interval) a failed try starts
	}
	a.Close() // the replica dies: nothing settles, nothing renews
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	if n, err := c.ZCard(context.Background(), prefix+"{t}:conc").Result(); err != nil || n != 3 {
		t.Fatalf("leases in redis: %d %v, want the dead replica's 3", n, err)
	}
	cb.add(45 * time.Second) // before +50 s (last renewal +20 s, lease 30 s)
	if _, err := b.Reserve(id, Want{PromptTokens: 10}); !is429(err, "concurrency") {
		t.Fatalf("+45 s: %v, want concurrency 429", err)
	}
	cb.add(6 * time.Second) // +51 s
	for i := range 3 {
		if _, err := b.Reserve(id, Want{PromptTokens: 10}); err != nil {
			t.Fatalf("+51 s, slot %d: %v", i+1, err)
		}
	}
}

// lease_ttl is validated: at least 1 s and 3 × timeout, at most ticket_ttl.
func TestLeaseTTLValidated(t *testing.T) {
	for _, d := range []time.Duration{0, 200 * time.Millisecond, 2 * time.Hour} {
		cfg := config.Default()
		cfg.Admission.Backend = "redis"
		cfg.Admission.Redis.LeaseTTL = d
		if err := cfg.Validate(); err == nil {
			t.Fatalf("lease_ttl %v accepted", d)
		}
	}
}
