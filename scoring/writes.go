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
