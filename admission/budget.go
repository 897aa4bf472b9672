package admission

import (
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/kvroute/kvroute/config"
)

// window is the length of the fixed budget window of tokens_per_minute and
// requests_per_minute.
const window = time.Minute

// Refusal says why a reservation did not fit: the limit hit, with the state the
// x-ratelimit-* headers report.
type Refusal struct {
	Reason string // tokens, requests, concurrency, unavailable (fail_closed while Redis is down)
	// Limit, Remaining and Reset of the token and request budgets (0 limit: unlimited).
	// For a token refusal they are the refusing window's; otherwise the per-minute one's.
	TokenLimit, TokensRemaining     int64
	RequestLimit, RequestsRemaining int64
	Reset                           time.Duration // until the refusing (or minute) window ends
	Window                          time.Duration // the refusing token window
	Model                           string        // the refusing limit's model ("" tenant-wide)
}

// tokenLimit is one token counter a reservation checks and charges: scope "" is the
// tenant-wide counter, otherwise a model's; limit 0 counts without limiting.
type tokenLimit struct {
	model  string
	window time.Duration
	limit  int64
}

// plan is everything one reservation checks and charges, in one step.
type plan struct {
	tenant string
	lim    config.Limits // for /debug/admission
	tokens []tokenLimit  // tokens[0] is always the tenant-wide minute counter
	rpm    int64         // requests per minute (0 unlimited)
	conc   int64         // max concurrent (0 unlimited)
	cost   int64
}

// scaled is p with every limit divided by n (floored, at least 1 where set): what one
// of n replicas enforces alone while the shared backend is down.
func (p plan) scaled(n int) plan {
	if n <= 1 {
		return p
	}
	div := func(v int64) int64 {
		if v <= 0 {
			return v
		}
		return max(v/int64(n), 1)
	}
	q := p
	q.tokens = make([]tokenLimit, len(p.tokens))
	for i, t := range p.tokens {
		t.limit = div(t.limit)
		q.tokens[i] = t
	}
	q.rpm, q.conc = div(p.rpm), div(p.conc)
	return q
}

// Reservation is an admitted request's hold on its tenant's budget.
type Reservation struct {
	Tenant string
	Tokens int64 // token cost reserved
	tokens []tokenLimit
	wins   []int64 // window index each of tokens was charged in
	ticket string  // redis: the ticket id settled once
	via    backend // the backend holding it; nil: admitted without one (fail_open)
}

// backend holds budget state. reserve checks and charges a plan in one step (an error
// means the backend could not be asked); settle replaces a reservation's cost by the
// actual cost and releases its concurrency slot, at most once per reservation.
type backend interface {
	reserve(p plan, now time.Time) (Reservation, *Refusal, error)
	settle(r Reservation, actual int64, now time.Time) error
	snapshot(now time.Time) []TenantState
}

// TenantState is one tenant's budget state, for /debug/admission.
type TenantState struct {
	Tenant          string        `json:"tenant"`
	Limits          config.Limits `json:"limits"`
	WindowTokens    int64         `json:"window_tokens"`   // cost charged in the current minute (reserved + settled)
	WindowRequests  int64         `json:"window_requests"` // admitted in the current minute
	Concurrent      int64         `json:"concurrent"`      // admitted, not yet settled
	WindowResetsSec float64       `json:"window_resets_in_seconds"`
	// Windows are the other token counters (other windows, per-model ones).
	Windows []WindowState `json:"windows,omitempty"`
	Backend string        `json:"backend"` // local, redis, or local_fallback (Redis down)
}

// WindowState is one token counter's state.
type WindowState struct {
	Model     string  `json:"model,omitempty"`
	WindowSec float64 `json:"window_seconds"`
	Limit     int64   `json:"limit"`
	Used      int64   `json:"used"`
}

// local is the in-memory budget backend: one mutex over every tenant's counters, so
// that checking and charging a reservation is one step (no check-then-increment race:
// concurrent requests against a budget of exactly K tokens admit exactly what fits).
type local struct {
	name    string // local or local_fallback
	mu      sync.Mutex
	tenants map[string]*bucket
	pruneAt int // prune idle buckets when tenants grows past this
}

// minPrune is the tenant count below which idle buckets are kept.
const minPrune = 1024

type counterKey struct {
	model  string
	window time.Duration
}

type counter struct {
	lim       int64
	win, used int64 // window index, cost charged in it
}

type bucket struct {
	lim        config.Limits
	tokens     map[counterKey]*counter
	reqWin     int64 // window index of requests
	requests   int64
	concurrent int64
}

func newLocal(name string) *local {
	return &local{name: name, tenants: map[string]*bucket{}, pruneAt: minPrune}
}

func windowIndex(now time.Time, w time.Duration) int64 { return now.UnixNano() / int64(w) }

func windowOf(now time.Time) int64 { return windowIndex(now, window) }

func resetAt(now time.Time, w time.Duration) time.Duration {
	return time.Duration((windowIndex(now, w)+1)*int64(w) - now.UnixNano())
}

func resetIn(now time.Time) time.Duration { return resetAt(now, window) }

// used is c's cost in window w.
func (c *counter) usedIn(w int64) int64 {
	if c.win != w {
		return 0
	}
	return c.used
}

// reserve charges p.cost to every token counter and one request to p.tenant when all
// its limits allow.
func (l *local) reserve(p plan, now time.Time) (Reservation, *Refusal, error) {
	rw := windowOf(now)
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.tenants[p.tenant]
	if b == nil {
		if len(l.tenants) >= l.pruneAt {
			l.pruneLocked(now)
		}
		b = &bucket{tokens: map[counterKey]*counter{}, reqWin: rw}
		l.tenants[p.tenant] = b
	}
	b.lim = p.lim
	if b.reqWin != rw {
		b.reqWin, b.requests = rw, 0
	}
	cs := make([]*counter, len(p.tokens))
	wins := make([]int64, len(p.tokens))
	for i, t := range p.tokens {
		k := counterKey{t.model, t.window}
		c := b.tokens[k]
		if c == nil {
			c = &counter{}
			b.tokens[k] = c
		}
		c.lim = t.limit
		cs[i], wins[i] = c, windowIndex(now, t.window)
	}
	minute := cs[0].usedIn(wins[0])
	ref := &Refusal{TokenLimit: p.tokens[0].limit, TokensRemaining: max(p.tokens[0].limit-minute, 0),
		RequestLimit: p.rpm, RequestsRemaining: max(p.rpm-b.requests, 0), Reset: resetIn(now), Window: window}
	switch {
	case p.conc > 0 && b.concurrent+1 > p.conc:
		ref.Reason = "concurrency"
	case p.rpm > 0 && b.requests+1 > p.rpm:
		ref.Reason = "requests"
	default:
		for i, t := range p.tokens {
			if u := cs[i].usedIn(wins[i]); t.limit > 0 && u+p.cost > t.limit {
				ref.Reason, ref.TokenLimit, ref.TokensRemaining = "tokens", t.limit, max(t.limit-u, 0)
				ref.Reset, ref.Window, ref.Model = resetAt(now, t.window), t.window, t.model
				break
			}
		}
	}
	if ref.Reason != "" {
		return Reservation{}, ref, nil
	}
	for i, c := range cs {
		if c.win != wins[i] {
			c.win, c.used = wins[i], 0
		}
		c.used += p.cost
	}
	b.requests++
	b.concurrent++
	return Reservation{Tenant: p.tenant, Tokens: p.cost, tokens: p.tokens, wins: wins, via: l}, nil, nil
}

// pruneLocked forgets buckets with nothing in flight whose every window ended (their
// state is the same as a new bucket's), so that the map is bounded by the tenants
// active in the longest window.
func (l *local) pruneLocked(now time.Time) {
	for t, b := range l.tenants {
		if b.concurrent == 0 && b.reqWin != windowOf(now) && b.idle(now) {
			delete(l.tenants, t)
		}
	}
	l.pruneAt = max(minPrune, 2*len(l.tenants))
}

func (b *bucket) idle(now time.Time) bool {
	for k, c := range b.tokens {
		if c.win == windowIndex(now, k.window) && c.used != 0 {
			return false
		}
	}
	return true
}

// settle replaces r's reserved cost by the actual cost and releases its concurrency
// slot. In the window it was reserved in, the difference is charged (or refunded);
// after that window ended, an overrun is charged to the current window and a refund
// is void (the old window's budget is gone).
func (l *local) settle(r Reservation, actual int64, now time.Time) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.tenants[r.Tenant]
	if b == nil {
		return nil
	}
	b.concurrent = max(b.concurrent-1, 0)
	d := actual - r.Tokens
	for i, t := range r.tokens {
		c := b.tokens[counterKey{t.model, t.window}]
		if c == nil {
			continue
		}
		w := windowIndex(now, t.window)
		switch {
		case r.wins[i] == w && c.win == w:
			c.used = max(c.used+d, 0)
		case d > 0:
			if c.win != w {
				c.win, c.used = w, 0
			}
			c.used += d
		}
	}
	return nil
}

// snapshot copies every tenant's state, sorted by tenant. It holds the mutex only to
// copy: nothing is encoded under it.
func (l *local) snapshot(now time.Time) []TenantState {
	rw := windowOf(now)
	l.mu.Lock()
	out := make([]TenantState, 0, len(l.tenants))
	for t, b := range l.tenants {
		s := TenantState{Tenant: t, Limits: b.lim, Concurrent: b.concurrent, Backend: l.name}
		if b.reqWin == rw {
			s.WindowRequests = b.requests
		}
		for k, c := range b.tokens {
			u := c.usedIn(windowIndex(now, k.window))
			if k.model == "" && k.window == window {
				s.WindowTokens = u
				continue
			}
			s.Windows = append(s.Windows, WindowState{Model: k.model, WindowSec: k.window.Seconds(), Limit: c.lim, Used: u})
		}
		out = append(out, s)
	}
	l.mu.Unlock()
	reset := resetIn(now).Seconds()
	for i := range out {
		out[i].WindowResetsSec = reset
		sortWindows(out[i].Windows)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tenant < out[j].Tenant })
	return out
}

func sortWindows(ws []WindowState) {
	sort.Slice(ws, func(i, j int) bool {
		if ws[i].Model != ws[j].Model {
			return ws[i].Model < ws[j].Model
		}
		return ws[i].WindowSec < ws[j].WindowSec
	})
}

// errNoBackend is never returned by local; it exists so that backend errors have one type to wrap.
var errNoBackend = errors.New("admission: budget backend unavailable")
