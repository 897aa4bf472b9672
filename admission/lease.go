package admission

import (
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvroute/kvroute/metrics"
)

// renewScript extends the leases of one tenant's reservations still in flight on this
// replica: a ticket whose key still holds '1' (not settled, not expired, not a
// cancel's tombstone) gets its concurrency-set score and its key's TTL pushed to
// now + lease; any other ticket is left alone (never re-created).
//
//	KEYS[1] concurrency sorted set, KEYS[2..] ticket keys
//	ARGV[1] now ms, ARGV[2] lease TTL ms, ARGV[3..] ticket ids (ARGV[i+1] for KEYS[i])
//
// Returns the number of leases renewed.
var renewScript = redis.NewScript(`
local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local n = 0
for i = 2, #KEYS do
  if redis.call('GET', KEYS[i]) == '1' then
    redis.call('PEXPIRE', KEYS[i], ttl)
    redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[i + 1])
    n = n + 1
  end
end
if n > 0 and redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return n
`)

// leaseBatch bounds the tickets renewed by one script call.
const leaseBatch = 256

// leases are this replica's reservations in flight in Redis, by ticket id: what
// renewLoop keeps alive and what a lost settlement or a dead replica lets expire.
type leases struct {
	mu    sync.Mutex
	held  map[string]heldLease // guarded by mu
	gauge interface{ Set(float64) }
}

type heldLease struct {
	tenant string
	since  time.Time
}

func newLeases(m *metrics.Admission) *leases {
	return &leases{held: map[string]heldLease{}, gauge: m.RedisLeases}
}

func (l *leases) hold(res Reservation, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held[res.ticket] = heldLease{tenant: res.Tenant, since: now}
	l.gauge.Set(float64(len(l.held)))
}

func (l *leases) drop(ticket string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.held, ticket)
	l.gauge.Set(float64(len(l.held)))
}

// byTenant returns the tickets to renew, by tenant, forgetting those held longer than
// maxAge (ticket_ttl: the router has expired their requests by then).
func (l *leases) byTenant(now time.Time, maxAge time.Duration) map[string][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string][]string{}
	for t, h := range l.held {
		if now.Sub(h.since) > maxAge {
			delete(l.held, t)
			continue
		}
		out[h.tenant] = append(out[h.tenant], t)
	}
	l.gauge.Set(float64(len(l.held)))
	return out
}

// Len is the number of leases this replica holds.
func (l *leases) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held)
}

// renewLoop renews this replica's leases every lease_ttl/3, so a lease outlives its
// request here by at most lease_ttl: a request in flight keeps its slot however long
// it streams, a lost one gives it back.
func (r *redisBackend) renewLoop() {
	defer r.wg.Done()
	t := time.NewTicker(r.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			r.renew(r.now())
		}
	}
}

// renew runs renewScript for every held lease (one call per tenant and leaseBatch
// tickets), skipped while Redis counts as down. It returns the leases renewed.
func (r *redisBackend) renew(now time.Time) int {
	if r.down(now) {
		return 0
	}
	n := 0
	for tenant, tickets := range r.leases.byTenant(now, r.cfg.TicketTTL) {
		for len(tickets) > 0 {
			b := tickets[:min(len(tickets), leaseBatch)]
			tickets = tickets[len(b):]
			keys := []string{r.key(tenant, "conc")}
			args := []any{now.UnixMilli(), r.cfg.LeaseTTL.Milliseconds()}
			for _, id := range b {
				keys = append(keys, r.key(tenant, "tk", id))
				args = append(args, id)
			}
			ctx, cancel := r.ctx()
			k, err := renewScript.Run(ctx, r.c, keys, args...).Int()
			cancel()
			if err != nil {
				r.failed("renew", now, err)
				return n
			}
			r.up()
			n += k
		}
	}
	return n
}
