package scoring

import (
	"math"
	"time"
)

// decayed is an exponentially decayed sum: each amount added counts 0.5^(age/halfLife)
// later. The predictor keeps one per worker of the uncached prompt tokens it routed
// there — the tokens the worker had to write into its prefix cache, each write evicting
// the least recently used unreferenced block once the cache is full (vLLM v1
// FreeKVCacheBlockQueue). A worker with fewer recent writes turns its cache over more
// slowly: its LRU victim is older, hence (LRU's own premise) the least likely to be
// needed again.
type decayed struct {
	v float64   // value at t
	t time.Time // when v was last brought up to date
}

// at returns the decayed value at now (now before the last update counts as the last update).
func (d *decayed) at(now time.Time, halfLife time.Duration) float64 {
	if d.v == 0 || now.IsZero() || d.t.IsZero() || !now.After(d.t) || halfLife <= 0 {
		return d.v
	}
	return d.v * math.Exp2(-float64(now.Sub(d.t))/float64(halfLife))
}

// add decays the sum to now and adds x.
func (d *decayed) add(x float64, now time.Time, halfLife time.Duration) {
	d.v = d.at(now, halfLife) + x
	if now.After(d.t) {
		d.t = now
	}
}

// recentCap bounds the event times a recent keeps (more than a scrape interval's worth
// of first tokens on one worker at any realistic rate).
const recentCap = 256

// recent is a bounded ring of event times (ascending as added).
type recent struct {
	t    [recentCap]time.Time
	n    int // events kept (≤ recentCap)
	next int // ring position of the next add
}

func (r *recent) add(at time.Time) {
	r.t[r.next] = at
	r.next = (r.next + 1) % recentCap
	r.n = min(r.n+1, recentCap)
}

// since counts the kept events after t, newest first, stopping at the first at or
// before t (events are added in time order, up to the order concurrent reports arrive
// in), so it costs O(events since t). 0 for a zero t (never scraped).
func (r *recent) since(t time.Time) int {
	if t.IsZero() {
		return 0
	}
	k := 0
	for i := 1; i <= r.n; i++ {
		if !r.t[(r.next-i+recentCap)%recentCap].After(t) {
			break
		}
		k++
	}
	return k
}
