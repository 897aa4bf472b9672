package admission

import (
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
	Reason string // tokens, requests, concurrency
	// Limit, Remaining and Reset of the token and request budgets (0 limit: unlimited).
	TokenLimit, TokensRemaining     int64
	RequestLimit, RequestsRemaining int64
	Reset                           time.Duration // until the current window ends
}

// Reservation is an admitted request's hold on its tenant's budget.
type Reservation struct {
	Tenant string
	Tokens int64 // token cost reserved
	window int64 // index of the window it was charged to
}

// TenantState is one tenant's budget state, for /debug/admission.
type TenantState struct {
	Tenant          string        `json:"tenant"`
	Limits          config.Limits `json:"limits"`
	WindowTokens    int64         `json:"window_tokens"`   // cost charged in the current window (reserved + settled)
	WindowRequests  int64         `json:"window_requests"` // admitted in the current window
	Concurrent      int64         `json:"concurrent"`      // admitted, not yet settled
	WindowResetsSec float64       `json:"window_resets_in_seconds"`
}

// local is the in-memory budget backend: one mutex over every tenant's counters, so
// that checking and charging a reservation is one step (no check-then-increment race:
// concurrent requests against a budget of exactly K tokens admit exactly what fits).
type local struct {
	mu      sync.Mutex
	tenants map[string]*bucket
	pruneAt int // prune idle buckets when tenants grows past this
}

// minPrune is the tenant count below which idle buckets are kept.
const minPrune = 1024

type bucket struct {
	lim              config.Limits
	win              int64 // window index of tokens/requests
	tokens, requests int64
	concurrent       int64
}

func newLocal() *local { return &local{tenants: map[string]*bucket{}, pruneAt: minPrune} }

func windowOf(now time.Time) int64 { return now.UnixNano() / int64(window) }

func resetIn(now time.Time) time.Duration {
	return time.Duration((windowOf(now)+1)*int64(window) - now.UnixNano())
}

// roll starts a new window when w is later than b's.
func (b *bucket) roll(w int64) {
	if w != b.win {
		b.win, b.tokens, b.requests = w, 0, 0
	}
}

// reserve charges cost tokens and one request to tenant when all its limits allow.
func (l *local) reserve(tenant string, lim config.Limits, cost int64, now time.Time) (Reservation, *Refusal) {
	w := windowOf(now)
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.tenants[tenant]
	if b == nil {
		if len(l.tenants) >= l.pruneAt {
			l.pruneLocked(w)
		}
		b = &bucket{win: w}
		l.tenants[tenant] = b
	}
	b.lim = lim
	b.roll(w)
	reason := ""
	switch {
	case lim.MaxConcurrent > 0 && b.concurrent+1 > lim.MaxConcurrent:
		reason = "concurrency"
	case lim.RequestsPerMinute > 0 && b.requests+1 > lim.RequestsPerMinute:
		reason = "requests"
	case lim.TokensPerMinute > 0 && b.tokens+cost > lim.TokensPerMinute:
		reason = "tokens"
	}
	if reason != "" {
		return Reservation{}, &Refusal{Reason: reason, TokenLimit: lim.TokensPerMinute, TokensRemaining: max(lim.TokensPerMinute-b.tokens, 0),
			RequestLimit: lim.RequestsPerMinute, RequestsRemaining: max(lim.RequestsPerMinute-b.requests, 0), Reset: resetIn(now)}
	}
	b.tokens += cost
	b.requests++
	b.concurrent++
	return Reservation{Tenant: tenant, Tokens: cost, window: w}, nil
}

// pruneLocked forgets buckets with nothing in flight whose window ended (their state
// is the same as a new bucket's), so that the map is bounded by the tenants active in
// one window.
func (l *local) pruneLocked(w int64) {
	for t, b := range l.tenants {
		if b.concurrent == 0 && b.win != w {
			delete(l.tenants, t)
		}
	}
	l.pruneAt = max(minPrune, 2*len(l.tenants))
}

// settle replaces r's reserved cost by the actual cost and releases its concurrency
// slot. In the window it was reserved in, the difference is charged (or refunded);
// after that window ended, an overrun is charged to the current window and a refund
// is void (the old window's budget is gone).
func (l *local) settle(r Reservation, actual int64, now time.Time) {
	w := windowOf(now)
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.tenants[r.Tenant]
	if b == nil {
		return
	}
	b.concurrent--
	b.roll(w)
	d := actual - r.Tokens
	if r.window == w || d > 0 {
		b.tokens = max(b.tokens+d, 0)
	}
}

// snapshot copies every tenant's state, sorted by tenant. It holds the mutex only to
// copy: nothing is encoded under it.
func (l *local) snapshot(now time.Time) []TenantState {
	w := windowOf(now)
	l.mu.Lock()
	out := make([]TenantState, 0, len(l.tenants))
	for t, b := range l.tenants {
		s := TenantState{Tenant: t, Limits: b.lim, Concurrent: b.concurrent}
		if b.win == w {
			s.WindowTokens, s.WindowRequests = b.tokens, b.requests
		}
		out = append(out, s)
	}
	l.mu.Unlock()
	reset := resetIn(now).Seconds()
	for i := range out {
		out[i].WindowResetsSec = reset
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tenant < out[j].Tenant })
	return out
}
