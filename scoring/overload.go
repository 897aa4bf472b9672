package scoring

import (
	"math"
	"time"
)

// This file holds the terms that matter when the cluster is loaded: the prefill work a
// pick adds (its cost to the requests behind it), the prefix blocks the queue ahead
// evicts before the request is scheduled, and the remaining prefill work of a deep
// queue. The formulas and their sources are in README.md ("Overload").

// keptAfterWait returns how many of cached tokens are still cached when the request is
// scheduled on c, behind queueTok tokens of prefill queued ahead.
//
// Every uncached token queued ahead is written into a new KV block when its chunk is
// scheduled; vLLM v1 takes those blocks from the free queue, evicting the least
// recently used cached block first (vllm/v1/core/block_pool.py, FreeKVCacheBlockQueue).
// vllm:kv_cache_usage_perc is 1 − free/total where free blocks include cached,
// unreferenced ones, so (1 − KVUsage)·BlockCapacity is what the queue can write before
// it evicts anything still referenced. A prefix waiting behind more writes than that is
// gone; with fewer, the writes take the other free blocks first (a prefix cached for
// this request was used recently, so it is among the last LRU victims) and keep
// max(0, free − writes) blocks of it. Unknown capacity or an unscraped worker: the
// index's hit stands.
func keptAfterWait(in *Input, c *Candidate, cached int, queueTok float64) int {
	if cached <= 0 || queueTok <= 0 || c.Worker == nil || c.Load.ScrapedAt.IsZero() || in.BlockSize <= 0 {
		return cached
	}
	capBlocks := c.Worker.Profile.BlockCapacity
	if capBlocks <= 0 {
		return cached
	}
	free := float64(capBlocks) * (1 - min(max(c.Load.KVUsage, 0), 1))
	left := free - queueTok/float64(in.BlockSize) // blocks still free when our turn comes
	if left*float64(in.BlockSize) >= float64(cached) {
		return cached
	}
	if left <= 0 {
		return 0
	}
	return min(cached, int(left)*in.BlockSize)
}

// backlog is the remaining prefill work of the requests kvroute routed to one worker
// (Lindley's recursion for the work in a single-server queue, Lindley 1952): each pick
// adds its uncached tokens; the worker drains them at its learned prefill rate; a
// worker with no booked prefill has none. It is what makes the queue term right for
// deep queues: the head of the queue is partly prefilled, the tail not at all, and the
// bookings' full uncached tokens (an upper bound, kept as a cap) describe neither.
//
// The recursion drains at the compute rate; an engine waiting for KV space drains
// slower. So it keeps the uncached tokens of the picks still without a first token in
// pick order (pending, FCFS as vLLM v1 schedules them), and the queue term never
// counts less than the bookings minus the head of that queue: only the head can be
// partly prefilled.
type backlog struct {
	tokens  float64   // remaining at t
	t       time.Time // last update
	pending []float64 // uncached tokens of our picks without a first token, oldest first
}

// maxPending bounds pending (picks whose first token is never reported — aborts — are
// dropped when the worker has nothing booked, or here).
const maxPending = 4096

// head returns the oldest pending pick's uncached tokens.
func (b *backlog) head() (float64, bool) {
	if len(b.pending) == 0 {
		return 0, false
	}
	return b.pending[0], true
}

// pop drops the oldest pending pick (its first token was observed).
func (b *backlog) pop() {
	if len(b.pending) > 0 {
		b.pending = b.pending[1:]
	}
}

// at returns the backlog drained to now at rate tokens/s.
func (b *backlog) at(now time.Time, rate float64) float64 {
	if b.tokens <= 0 || b.t.IsZero() || now.IsZero() || !now.After(b.t) || rate <= 0 {
		return max(b.tokens, 0)
	}
	return max(0, b.tokens-now.Sub(b.t).Seconds()*rate)
}

// add drains the backlog to now and adds tokens; booked is the worker's booked
// uncached prefill before this pick (0 resets: nothing of ours is left there).
func (b *backlog) add(tokens float64, booked int, now time.Time, rate float64) {
	if booked <= 0 {
		b.tokens = 0
		b.pending = b.pending[:0]
	} else {
		b.tokens = b.at(now, rate)
	}
	b.tokens += max(tokens, 0)
	if len(b.pending) >= maxPending {
		b.pending = append(b.pending[:0], b.pending[len(b.pending)-maxPending/2:]...)
	}
	b.pending = append(b.pending, max(tokens, 0))
	if now.After(b.t) || b.t.IsZero() {
		b.t = now
	}
}

// congestion is the factor that turns a pick's prefill seconds into the delay they
// impose on the requests after it: ρ/(1−ρ), the mean number of requests in an M/M/1
// system at utilization ρ (Little's law), each of which the added work delays by its
// own length — the congestion externality of Naor (1969) and Mendelson (1985,
// "Pricing computer services: queueing effects"). ρ is the cluster's offered prefill
// utilization: recent uncached tokens routed (the decayed writes, WriteHalfLife) over
// the cluster's prefill capacity in the same window. 0 when idle; capped at
// Options.CongestionMax (the M/M/1 factor diverges at ρ → 1, where queues grow without
// bound and any finite weight is a choice).
func congestion(o *Options, util float64) float64 {
	if o.CongestionMax <= 0 || util <= 0 {
		return 0
	}
	if util >= 1 {
		return o.CongestionMax
	}
	return min(util/(1-util), o.CongestionMax)
}

// backlogFactor is max(1, offered/served): how far the prefill the cluster was given
// (offered, decayed uncached tokens routed) runs ahead of what it has done (served, the
// same tokens decayed from their first token). While first tokens keep pace it is 1 (up
// to the lag of one TTFT against the decay window) and the utilization is the model's;
// when they fall behind, the cluster's queue is growing — offered prefill exceeds its
// capacity, whatever the learned rates say — and the factor scales the model's
// utilization up by the ratio (offered = served + the decayed backlog, so it is
// 1 + backlog/served). This is what makes ρ right at overload: the model's prefill
// rates (the profile's, and learned ones that barely move while the queue term
// dominates the TTFT) overstate the rate of long prompts, whose attention cost grows
// with context (Mooncake trace at 3×: model ρ 0.66–0.79 against offered/served
// 1.4–1.6). 1 when nothing is served yet.
func backlogFactor(offered, served float64) float64 {
	if served <= 0 || offered <= served {
		return 1
	}
	return offered / served
}

// windowSeconds is the effective length of an exponentially decayed sum with the given
// half-life: ∫ 0.5^(t/h) dt = h/ln 2.
func windowSeconds(halfLife time.Duration) float64 {
	return halfLife.Seconds() / math.Ln2
}
