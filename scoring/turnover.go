package scoring

import (
	"math"
	"time"

	"github.com/kvroute/kvroute/kvindex"
)

// This file prices the cache copy a pick leaves behind: a conversation placed on a worker
// whose prefix cache turns over faster than the conversation returns loses its context
// before its next turn, a recompute the pick's own TTFT does not see. README.md
// ("Cache turnover") has the formula and its sources.

// reuseStride is the spacing, in blocks, of the block keys the reuse clock samples: a
// prompt is remembered by its last key at a multiple of reuseStride, so a later prompt
// that extends it (the next turn of a conversation) finds it within len(Keys)/reuseStride
// lookups. 16 blocks = 256 tokens at vLLM's default block size.
const reuseStride = 16

// reuseCap bounds the prompts the reuse clock remembers; at the cap, entries older than
// reuseHorizon are dropped (and, if that frees nothing, all of them).
const reuseCap = 1 << 16

// reuseAlpha is the EWMA weight of one measured reuse interval (≈ the last 20).
const reuseAlpha = 0.05

// reuseClock measures how long prompts take to come back: it remembers when each
// prompt was routed (by its last sampled block key) and, when a later prompt extends
// one, the time since — the reuse interval of that context (for chat: think time + the
// previous reply's decode + its queue). It keeps an EWMA of the intervals measured,
// the estimate for prompts that extend nothing remembered (first turns).
type reuseClock struct {
	last    map[kvindex.Key]time.Time
	mean    float64 // EWMA of measured intervals, seconds; 0 = none measured yet
	horizon time.Duration
}

// sampledKey is the last key of keys at a multiple of reuseStride (index n−1 rounded
// down); ok is false for an empty prompt.
func sampledKey(keys []kvindex.Key) (kvindex.Key, bool) {
	if len(keys) == 0 {
		return 0, false
	}
	return keys[(len(keys)-1)/reuseStride*reuseStride], true
}

// interval returns the reuse interval, in seconds, that prices this prompt's context:
// the time since the deepest remembered prompt it extends was routed, or the EWMA of
// measured intervals when it extends none (0 when nothing was ever measured). found
// reports whether the prompt extended a remembered one.
func (r *reuseClock) interval(keys []kvindex.Key, now time.Time) (sec float64, found bool) {
	if r.last != nil && !now.IsZero() {
		for i := (len(keys) - 1) / reuseStride * reuseStride; i >= 0 && len(keys) > 0; i -= reuseStride {
			if t, ok := r.last[keys[i]]; ok {
				if now.After(t) {
					return now.Sub(t).Seconds(), true
				}
				return 0, true
			}
		}
	}
	return r.mean, false
}

// record notes that the prompt was routed at now, and folds its measured interval (when
// found) into the mean.
func (r *reuseClock) record(keys []kvindex.Key, now time.Time, sec float64, found bool) {
	k, ok := sampledKey(keys)
	if !ok || now.IsZero() {
		return
	}
	if found && sec > 0 {
		if r.mean == 0 {
			r.mean = sec
		} else {
			r.mean += reuseAlpha * (sec - r.mean)
		}
	}
	if r.last == nil {
		r.last = map[kvindex.Key]time.Time{}
	}
	if len(r.last) >= reuseCap {
		for key, t := range r.last {
			if now.Sub(t) > r.horizon {
				delete(r.last, key)
			}
		}
		if len(r.last) >= reuseCap {
			clear(r.last)
		}
	}
	r.last[k] = now
}

// turnoverPrice is the expected future re-prefill, in seconds, of placing a prompt of
// promptTok tokens on a worker (Che's approximation of LRU: Che, Tung, Wang 2002;
// Fricker, Robert, Roberts 2012). The worker's cache of capTok tokens is written at
// writeRate tokens/s (its decayed writes over their window, this pick's included); its
// characteristic time is T = capTok / writeRate, the age at which an unreferenced block
// reaches the LRU end and is evicted. A context reused after an interval τ survives if
// τ < T; with reuse intervals exponential about their mean τ (Che's Poisson
// assumption), it is evicted with probability P(interval > T) = exp(−T/τ), and then its
// next turn recomputes promptTok tokens at the worker's prefill rate (tokens/s). 0 when
// any input is unknown or zero (idle worker: T = ∞).
func turnoverPrice(promptTok, capTok, writeRate, tau, rate float64) float64 {
	if promptTok <= 0 || capTok <= 0 || writeRate <= 0 || tau <= 0 || rate <= 0 {
		return 0
	}
	t := capTok / writeRate
	return math.Exp(-t/tau) * promptTok / rate
}

// turnoverCost is a pick's cache-turnover price, seconds: the expected re-prefill of its
// own context (turnoverPrice at the write rate after the pick, rateAfter) plus the
// expected re-prefill its writes add to the contexts already in the worker's LRU, taken
// as capTok tokens reused at the same interval: the rise of their eviction probability
// from rateBefore to rateAfter (writes shorten T for every block cached there).
func turnoverCost(promptTok, capTok, rateBefore, rateAfter, tau, rate float64) float64 {
	return turnoverPrice(promptTok, capTok, rateAfter, tau, rate) +
		max(turnoverPrice(capTok, capTok, rateAfter, tau, rate)-turnoverPrice(capTok, capTok, rateBefore, tau, rate), 0)
}
