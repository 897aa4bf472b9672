package admission

import (
	"container/list"
	"math"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/kvroute/kvroute/router"
)

// authThrottle limits failed API-key attempts per client address: a token bucket per
// client of capacity failures, refilled at failures per window (so at most failures +
// elapsed/window·failures guesses), held in an LRU of at most maxClients addresses
// (IPv6 clients by their /64, which one host usually holds whole). A client whose
// bucket is empty is refused before its key is looked at: the refusal costs one map
// lookup whatever the key. Memory is bounded by maxClients; a client evicted from a
// full LRU starts again with a full bucket, so an attacker holding more addresses
// than maxClients gains at most failures guesses per address it cycles through.
type authThrottle struct {
	failures   float64
	perSecond  float64
	maxClients int

	mu      sync.Mutex
	lru     list.List // of *authBucket, most recent first; guarded by mu
	clients map[netip.Addr]*list.Element
}

type authBucket struct {
	addr   netip.Addr
	tokens float64
	at     time.Time // tokens as of at
}

// newAuthThrottle returns nil (no throttle) when failures ≤ 0.
func newAuthThrottle(failures int, window time.Duration, maxClients int) *authThrottle {
	if failures <= 0 || window <= 0 || maxClients <= 0 {
		return nil
	}
	return &authThrottle{failures: float64(failures), perSecond: float64(failures) / window.Seconds(),
		maxClients: maxClients, clients: map[netip.Addr]*list.Element{}}
}

// clientKey is the bucket of addr: IPv4 (and IPv4-mapped IPv6) by address, IPv6 by
// /64. The zero Addr (a front that does not know its client) is never throttled: one
// shared bucket would let one client lock every other out.
func clientKey(addr netip.Addr) (netip.Addr, bool) {
	if !addr.IsValid() {
		return netip.Addr{}, false
	}
	addr = addr.Unmap()
	if addr.Is6() {
		p, _ := addr.Prefix(64)
		return p.Addr(), true
	}
	return addr, true
}

// refill brings b to now. Caller holds mu.
func (t *authThrottle) refill(b *authBucket, now time.Time) {
	if dt := now.Sub(b.at).Seconds(); dt > 0 {
		b.tokens = min(t.failures, b.tokens+dt*t.perSecond)
		b.at = now
	}
}

// allowed reports whether addr may try an API key now (nil-safe: always).
func (t *authThrottle) allowed(addr netip.Addr, now time.Time) bool {
	k, ok := clientKey(addr)
	if t == nil || !ok {
		return true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.clients[k]
	if e == nil {
		return true
	}
	b := e.Value.(*authBucket)
	t.refill(b, now)
	return b.tokens >= 1
}

// failed charges addr one failed attempt.
func (t *authThrottle) failed(addr netip.Addr, now time.Time) {
	k, ok := clientKey(addr)
	if t == nil || !ok {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.clients[k]
	if e == nil {
		if t.lru.Len() >= t.maxClients {
			old := t.lru.Back()
			delete(t.clients, old.Value.(*authBucket).addr)
			t.lru.Remove(old)
		}
		e = t.lru.PushFront(&authBucket{addr: k, tokens: t.failures, at: now})
		t.clients[k] = e
	} else {
		t.lru.MoveToFront(e)
	}
	b := e.Value.(*authBucket)
	t.refill(b, now)
	b.tokens = max(0, b.tokens-1)
}

// retryAfter is when an empty bucket holds one token again.
func (t *authThrottle) retryAfter() time.Duration {
	return time.Duration(math.Ceil(1/t.perSecond)) * time.Second
}

// len is the number of clients tracked.
func (t *authThrottle) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lru.Len()
}

func (t *authThrottle) refusal() *router.Error {
	return &router.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_exceeded", RetryAfter: t.retryAfter(),
		Message: "kvroute: too many failed API key attempts from this client (admission.auth_throttle)",
		Details: "kvroute_admission_auth_throttled", Header: [][2]string{{RejectedReasonHeader, ReasonAuthThrottled}}}
}
