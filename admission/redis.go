package admission

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
)

// reserveScript checks and charges one reservation atomically on the Redis server
// (a script runs alone: no other client's command interleaves, so two replicas
// cannot both pass a check that only one fits).
//
//	KEYS[1] concurrency sorted set (member ticket id, score lease deadline, ms)
//	KEYS[2] requests counter of the current minute
//	KEYS[3] ticket key (exists until settled)
//	KEYS[4..] token counters of the current windows (KEYS[4]: tenant-wide minute)
//	ARGV[1] now ms, ARGV[2] lease TTL ms, ARGV[3] max concurrent, ARGV[4] requests
//	per minute, ARGV[5] requests key TTL ms, ARGV[6] cost, ARGV[7] ticket id, then per
//	token counter its limit and its key TTL ms (0 limit: count only).
//
// Returns {code, index, used, requests, minute used}: code 0 admitted, 1 concurrency,
// 2 requests, 3 tokens (index: the refusing token counter, 1-based; used: its cost),
// 4 cancelled (the ticket key exists already: a cancel of this reservation, sent after
// the client timed out waiting for it, ran first; nothing is charged).
var reserveScript = redis.NewScript(`
local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local conc, rpm, cost = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[6])
if redis.call('EXISTS', KEYS[3]) == 1 then return {4, 0, 0, 0, 0} end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local reqs = tonumber(redis.call('GET', KEYS[2]) or '0')
local minute = tonumber(redis.call('GET', KEYS[4]) or '0')
if conc > 0 and redis.call('ZCARD', KEYS[1]) + 1 > conc then return {1, 0, 0, reqs, minute} end
if rpm > 0 and reqs + 1 > rpm then return {2, 0, 0, reqs, minute} end
for i = 4, #KEYS do
  local lim = tonumber(ARGV[8 + (i - 4) * 2])
  if lim > 0 then
    local used = tonumber(redis.call('GET', KEYS[i]) or '0')
    if used + cost > lim then return {3, i - 3, used, reqs, minute} end
  end
end
for i = 4, #KEYS do
  redis.call('INCRBY', KEYS[i], cost)
  if redis.call('PTTL', KEYS[i]) < 0 then redis.call('PEXPIRE', KEYS[i], ARGV[9 + (i - 4) * 2]) end
end
redis.call('INCR', KEYS[2])
if redis.call('PTTL', KEYS[2]) < 0 then redis.call('PEXPIRE', KEYS[2], ARGV[5]) end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[7])
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
redis.call('SET', KEYS[3], '1', 'PX', ttl)
return {0, 0, 0, reqs + 1, minute + cost}
`)

// settleScript settles one ticket exactly once: only the call that deletes the ticket
// key applies the deltas and releases the concurrency slot; any later call (a retry,
// a second replica) finds no ticket and changes nothing.
//
//	KEYS[1] concurrency sorted set, KEYS[2] ticket key, KEYS[3..] token counters
//	ARGV[1] ticket id, ARGV[2] cancel (1: the reservation's reply was lost; if it has
//	not run yet, leave a tombstone "c" for ARGV[3] ms so that it refuses itself when it
//	does), then per token counter the delta and the key TTL ms
//
// Returns 1 when settled now, 0 when the ticket was already settled (or expired).
var settleScript = redis.NewScript(`
local v = redis.call('GET', KEYS[2])
if v == false then
  if ARGV[2] == '1' then redis.call('SET', KEYS[2], 'c', 'PX', ARGV[3]) end
  return 0
end
if v ~= '1' then return 0 end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[1], ARGV[1])
for i = 3, #KEYS do
  local d = tonumber(ARGV[4 + (i - 3) * 2])
  if d ~= 0 then
    if redis.call('INCRBY', KEYS[i], d) < 0 then redis.call('SET', KEYS[i], '0', 'KEEPTTL') end
    if redis.call('PTTL', KEYS[i]) < 0 then redis.call('PEXPIRE', KEYS[i], ARGV[5 + (i - 3) * 2]) end
  end
end
return 1
`)

// keySlack keeps a window's counter this long past the window's end, so that a late
// settlement in the same window still finds it.
const keySlack = time.Minute

// redisBackend keeps budgets in Redis, shared by every replica with the same keys.
// Every call is bounded by admission.redis.timeout; after a failure Redis counts as
// down for retry_interval, and reservations meanwhile follow the tenant's redis_down
// mode (Admitter.reserve). A call that timed out after Redis ran it stays charged
// there while the fallback charges it too: conservative, never an overrun.
type redisBackend struct {
	c         *redis.Client
	cfg       config.RedisBudget
	m         *metrics.Admission
	downUntil atomic.Int64 // unix ns; Redis counts as down before it
	fallback  *local       // redis_down local: 1/replicas of every limit

	now    func() time.Time
	isDown atomic.Bool // logged as down (one line at down, one at recovery)

	leases    *leases       // this replica's reservations in flight, renewed every lease_ttl/3
	retry     chan settleOp // settlements (and cancels) to retry until applied; bounded
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once

	mu   sync.Mutex
	seen map[string]config.Limits // tenants reserved here, for /debug/admission (bounded)
}

// settleOp is one settlement retried until Redis applies it: settleScript is
// idempotent by ticket key, so a retry of a call that did run changes nothing.
type settleOp struct {
	res    Reservation
	actual int64
	cancel bool      // the reservation's reply was lost: release it if it ran, forbid it if not
	until  time.Time // give up after this (the lease has expired in Redis by then)
}

// maxRetries bounds the settlements waiting to be retried; one more is dropped and
// counted (its lease then ends at its TTL).
const maxRetries = 4096

// maxSeen bounds the tenants /debug/admission reads back from Redis.
const maxSeen = 256

// now is the Admitter's clock (the retries' down spells are on it).
func newRedis(cfg config.RedisBudget, m *metrics.Admission, now func() time.Time) (*redisBackend, error) {
	tc, err := RedisTLSConfig(cfg.TLS)
	if err != nil {
		return nil, err
	}
	c := redis.NewClient(&redis.Options{Addr: cfg.Addr, DB: cfg.DB, Username: cfg.Username, Password: cfg.Password, TLSConfig: tc,
		DialTimeout: cfg.Timeout, ReadTimeout: cfg.Timeout,
		WriteTimeout: cfg.Timeout, PoolTimeout: cfg.Timeout, MaxRetries: -1, ContextTimeoutEnabled: true, DisableIdentity: true})
	r := &redisBackend{c: c, cfg: cfg, m: m, fallback: newLocal("local_fallback"), seen: map[string]config.Limits{},
		retry: make(chan settleOp, maxRetries), stop: make(chan struct{}), now: now, leases: newLeases(m)}
	r.wg.Add(2)
	go r.retryLoop()
	go r.renewLoop()
	return r, nil
}

// retryLoop applies queued settlements one at a time, each tried with exponential
// backoff (timeout, doubling, at most retry_interval) until Redis answers or its lease
// has expired there anyway.
func (r *redisBackend) retryLoop() {
	defer r.wg.Done()
	for {
		var op settleOp
		select {
		case <-r.stop:
			return
		case op = <-r.retry:
		}
		for wait := r.cfg.Timeout; ; wait = min(2*wait, r.cfg.RetryInterval) {
			if r.apply(op, r.now()) == nil || r.now().After(op.until) {
				break
			}
			select {
			case <-r.stop:
				return
			case <-time.After(wait):
			}
		}
	}
}

// later queues op for retryLoop; false when the queue is full.
func (r *redisBackend) later(op settleOp) bool {
	select {
	case r.retry <- op:
		return true
	default:
		r.m.BackendErrors.WithLabelValues("settle_dropped").Inc()
		return false
	}
}

// RedisTLSConfig is the client TLS configuration of t; nil when TLS is off. Errors
// name the key: a CA file that cannot be read or holds no PEM certificate, a client
// certificate pair that does not load. TLS 1.2 at least.
func RedisTLSConfig(t config.RedisTLS) (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("admission.redis.tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("admission.redis.tls.ca_file: %s holds no PEM certificate", t.CAFile)
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" || t.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("admission.redis.tls.cert_file/key_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// close stops the retry and renewal loops and closes the client; a second call does
// nothing.
func (r *redisBackend) close() error {
	var err error
	r.closeOnce.Do(func() {
		close(r.stop)
		r.wg.Wait()
		err = r.c.Close()
	})
	return err
}

// down reports whether Redis counts as down at now (a recent call failed).
func (r *redisBackend) down(now time.Time) bool { return now.UnixNano() < r.downUntil.Load() }

func (r *redisBackend) failed(op string, now time.Time, err error) {
	r.m.BackendErrors.WithLabelValues(op).Inc()
	r.downUntil.Store(now.Add(r.cfg.RetryInterval).UnixNano())
	if r.isDown.CompareAndSwap(false, true) {
		slog.Warn("admission: redis budget backend down; reservations follow redis_down, settlements are retried", "addr", r.cfg.Addr, "op", op, "err", err)
	}
}

// up records a call Redis answered: one log line when it was down.
func (r *redisBackend) up() {
	if r.isDown.CompareAndSwap(true, false) {
		slog.Info("admission: redis budget backend recovered", "addr", r.cfg.Addr, "retrying", len(r.retry))
	}
}

// key is KEYS' naming: prefix{tenant}:kind... — the {tenant} hash tag keeps all of a
// tenant's keys in one Redis Cluster slot, as a script's keys must be.
func (r *redisBackend) key(tenant string, parts ...string) string {
	k := r.cfg.KeyPrefix + "{" + tenant + "}"
	for _, p := range parts {
		k += ":" + p
	}
	return k
}

func (r *redisBackend) tokenKey(tenant string, t tokenLimit, idx int64) string {
	scope := "t"
	if t.model != "" {
		scope = "m:" + strconv.Quote(t.model)
	}
	return r.key(tenant, "tok", scope, strconv.FormatInt(int64(t.window/time.Second), 10), strconv.FormatInt(idx, 10))
}

// ttlMs is how long the counter of window w at now must live: to the window's end
// plus keySlack.
func ttlMs(now time.Time, w time.Duration) int64 { return (resetAt(now, w) + keySlack).Milliseconds() }

func newTicket() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (r *redisBackend) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), r.cfg.Timeout)
}

func (r *redisBackend) reserve(p plan, now time.Time) (Reservation, *Refusal, error) {
	if r.down(now) {
		return Reservation{}, nil, errNoBackend
	}
	r.remember(p.tenant, p.lim)
	ticket := newTicket()
	wins := make([]int64, len(p.tokens))
	keys := []string{r.key(p.tenant, "conc"), r.key(p.tenant, "req", strconv.FormatInt(windowOf(now), 10)), r.key(p.tenant, "tk", ticket)}
	args := []any{now.UnixMilli(), r.cfg.LeaseTTL.Milliseconds(), p.conc, p.rpm, ttlMs(now, window), p.cost, ticket}
	for i, t := range p.tokens {
		wins[i] = windowIndex(now, t.window)
		keys = append(keys, r.tokenKey(p.tenant, t, wins[i]))
		args = append(args, t.limit, ttlMs(now, t.window))
	}
	ctx, cancel := r.ctx()
	defer cancel()
	v, err := reserveScript.Run(ctx, r.c, keys, args...).Int64Slice()
	if err != nil || len(v) != 5 {
		r.failed("reserve", now, err)
		// Redis may still run it (a stalled server reads the call when it resumes):
		// cancel it by its ticket, so that no lease is left that nobody settles.
		r.later(settleOp{res: Reservation{Tenant: p.tenant, Tokens: p.cost, tokens: p.tokens, wins: wins, ticket: ticket},
			cancel: true, until: now.Add(r.cfg.TicketTTL)})
		return Reservation{}, nil, fmt.Errorf("%w: redis reserve: %v", errNoBackend, err)
	}
	r.up()
	admitted, ref, err := decodeReserve(v, p, now)
	if err != nil { // whatever ran, nothing may stay charged under this ticket
		r.later(settleOp{res: Reservation{Tenant: p.tenant, Tokens: p.cost, tokens: p.tokens, wins: wins, ticket: ticket},
			cancel: true, until: now.Add(r.cfg.TicketTTL)})
		return Reservation{}, nil, err
	}
	if admitted {
		res := Reservation{Tenant: p.tenant, Tokens: p.cost, tokens: p.tokens, wins: wins, ticket: ticket, via: r}
		r.leases.hold(res, now)
		return res, nil, nil
	}
	return Reservation{}, ref, nil
}

// decodeReserve reads reserveScript's reply {code, index, used, requests, minute
// used} for plan p: admitted, or the refusal, or an error for a cancelled ticket (code
// 4) and for a reply no script of this version sends (another length, an unknown
// code, a negative count): the reply is input, never indexed unchecked.
func decodeReserve(v []int64, p plan, now time.Time) (admitted bool, ref *Refusal, err error) {
	if len(v) != 5 || len(p.tokens) == 0 || v[1] < 0 || v[2] < 0 || v[3] < 0 || v[4] < 0 {
		return false, nil, fmt.Errorf("%w: redis reserve: unexpected reply %v", errNoBackend, v)
	}
	ref = &Refusal{TokenLimit: p.tokens[0].limit, TokensRemaining: max(p.tokens[0].limit-v[4], 0),
		RequestLimit: p.rpm, RequestsRemaining: max(p.rpm-v[3], 0), Reset: resetIn(now), Window: window}
	switch v[0] {
	case 0:
		return true, nil, nil
	case 1:
		ref.Reason = "concurrency"
	case 2:
		ref.Reason = "requests"
	case 3:
		if v[1] < 1 || v[1] > int64(len(p.tokens)) {
			return false, nil, fmt.Errorf("%w: redis reserve: token counter %d of %d", errNoBackend, v[1], len(p.tokens))
		}
		t := p.tokens[v[1]-1]
		ref.Reason, ref.TokenLimit, ref.TokensRemaining = "tokens", t.limit, max(t.limit-v[2], 0)
		ref.Reset, ref.Window, ref.Model = resetAt(now, t.window), t.window, t.model
	case 4:
		return false, nil, fmt.Errorf("%w: redis reserve: ticket cancelled", errNoBackend)
	default:
		return false, nil, fmt.Errorf("%w: redis reserve: unknown reply code %d", errNoBackend, v[0])
	}
	return false, ref, nil
}

// settle runs settleScript for res (the same rule as local.settle: the difference in
// the reserved window, an overrun in the current one after it ended). It is tried
// even while Redis counts as down; one that fails is queued and retried with backoff
// until applied (exactly once: the ticket key), since a lost settlement would hold a
// concurrency slot until ticket_ttl.
func (r *redisBackend) settle(res Reservation, actual int64, now time.Time) error {
	r.leases.drop(res.ticket) // no longer renewed: if the settlement is lost, the slot ends at lease_ttl
	op := settleOp{res: res, actual: actual, until: now.Add(r.cfg.LeaseTTL)}
	if err := r.apply(op, now); err != nil {
		r.later(op)
		return err
	}
	return nil
}

// apply runs settleScript for op once.
func (r *redisBackend) apply(op settleOp, now time.Time) error {
	res, actual := op.res, op.actual
	if op.cancel {
		actual = 0 // a cancel refunds the whole reservation
	}
	cancel := "0"
	if op.cancel {
		cancel = "1"
	}
	keys := []string{r.key(res.Tenant, "conc"), r.key(res.Tenant, "tk", res.ticket)}
	args := []any{res.ticket, cancel, r.cfg.TicketTTL.Milliseconds()}
	d := actual - res.Tokens
	for i, t := range res.tokens {
		w := windowIndex(now, t.window)
		switch {
		case res.wins[i] == w:
			keys = append(keys, r.tokenKey(res.Tenant, t, w))
			args = append(args, d, ttlMs(now, t.window))
		case d > 0:
			keys = append(keys, r.tokenKey(res.Tenant, t, w))
			args = append(args, d, ttlMs(now, t.window))
		}
	}
	ctx, done := r.ctx()
	defer done()
	if err := settleScript.Run(ctx, r.c, keys, args...).Err(); err != nil {
		r.failed("settle", now, err)
		return fmt.Errorf("%w: redis settle: %v", errNoBackend, err)
	}
	r.up()
	return nil
}

func (r *redisBackend) remember(tenant string, lim config.Limits) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.seen[tenant]; !ok && len(r.seen) >= maxSeen {
		return
	}
	r.seen[tenant] = lim
}

// snapshot reads back the minute counters of the tenants this replica reserved for
// (at most maxSeen), in one pipeline bounded by the timeout; the local fallback's
// state follows when it has any. Nothing is read under a lock the request path needs.
func (r *redisBackend) snapshot(now time.Time) []TenantState {
	r.mu.Lock()
	tenants := make([]string, 0, len(r.seen))
	lims := make(map[string]config.Limits, len(r.seen))
	for t, l := range r.seen {
		tenants = append(tenants, t)
		lims[t] = l
	}
	r.mu.Unlock()
	slices.Sort(tenants)
	out := make([]TenantState, 0, len(tenants))
	if !r.down(now) && len(tenants) > 0 {
		ctx, cancel := r.ctx()
		defer cancel()
		pipe := r.c.Pipeline()
		type cmds struct {
			tok, req *redis.StringCmd
			conc     *redis.IntCmd
		}
		cs := make([]cmds, len(tenants))
		for i, t := range tenants {
			cs[i] = cmds{pipe.Get(ctx, r.tokenKey(t, tokenLimit{window: window}, windowOf(now))),
				pipe.Get(ctx, r.key(t, "req", strconv.FormatInt(windowOf(now), 10))),
				pipe.ZCount(ctx, r.key(t, "conc"), strconv.FormatInt(now.UnixMilli(), 10), "+inf")}
		}
		if _, err := pipe.Exec(ctx); err == nil || err == redis.Nil {
			for i, t := range tenants {
				tok, _ := cs[i].tok.Int64()
				req, _ := cs[i].req.Int64()
				out = append(out, TenantState{Tenant: t, Limits: lims[t], WindowTokens: tok, WindowRequests: req,
					Concurrent: cs[i].conc.Val(), WindowResetsSec: resetIn(now).Seconds(), Backend: "redis"})
			}
		}
	}
	return append(out, r.fallback.snapshot(now)...)
}
