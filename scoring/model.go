package scoring

import (
	"math"
	"time"

	"github.com/kvroute/kvroute/kvindex"
)

// Term indexes the TTFT model's terms (see doc.go for the formula and its sources).
type Term int

const (
	TermOverhead  Term = iota // fixed per-request time (scheduling, network, detokenizing the first token)
	TermPrefill               // prefill of this request's uncached tokens
	TermQueue                 // prefill work queued ahead of the request (FCFS waiting queue)
	TermLowerTier             // bringing lower-tier (CPU, disk) cached blocks back to the GPU
	TermDecode                // decode interference: running sequences sharing the engine steps
	TermAdapter               // loading the request's LoRA adapter (and waiting for a slot), adapter.go
	NumTerms
)

var termNames = [NumTerms]string{"overhead", "prefill", "queue", "lower_tier", "decode_interference", "adapter"}

// String returns the term's name as used in metrics labels and the explain view.
func (t Term) String() string { return termNames[t] }

// Features are the model's terms evaluated with the worker's prior coefficients, in
// seconds. The prediction is Σ θ_t·Features[t], where θ (one dimensionless factor per
// term, 1 = prior) is what the learner estimates per worker.
type Features [NumTerms]float64

// prior is a worker's coefficients before learning, in physical units.
type prior struct {
	overhead      float64 // s
	prefillRate   float64 // tokens/s
	cpuRate       float64 // tokens/s
	diskRate      float64 // tokens/s
	decodePerStep float64 // s per running sequence per engine step
}

func priorFor(o *Options, c *Candidate) prior {
	p := prior{overhead: o.Overhead.Seconds(), prefillRate: o.PrefillTokensPerSecond, cpuRate: o.CPUTierTokensPerSecond,
		diskRate: o.DiskTierTokensPerSecond, decodePerStep: o.DecodeInterference.Seconds()}
	if c.Worker != nil {
		pr := c.Worker.Profile
		if pr.PrefillTokensPerSecond > 0 {
			p.prefillRate = pr.PrefillTokensPerSecond
		}
		if pr.Overhead > 0 {
			p.overhead = pr.Overhead.Seconds()
		}
	}
	return p
}

// loadWeight is how much a scraped load counts at time now: 0.5^(age/halfLife); 0 for
// a never-scraped worker or when scraped load is disabled (halfLife < 0). A scrape from
// the future (clock skew) counts fully.
func loadWeight(scrapedAt, now time.Time, halfLife time.Duration) float64 {
	if scrapedAt.IsZero() || halfLife < 0 {
		return 0
	}
	if now.IsZero() {
		return 1
	}
	age := now.Sub(scrapedAt)
	if age <= 0 {
		return 1
	}
	return math.Exp2(-float64(age) / float64(halfLife))
}

// workerView is what the predictor keeps about one worker that the terms need besides
// the candidate itself.
type workerView struct {
	// foreignTokens is the expected uncached size of a request whose size kvroute does
	// not know (scraped waiting requests it did not route, token-less bookings), tokens.
	foreignTokens float64
	// backlog is the remaining prefill work of kvroute's booked requests on the worker,
	// tokens (Lindley recursion, overload.go); < 0 unknown (booked tokens count in full).
	backlog float64
	// leftWaiting and leftRunning count our requests and peer replicas' (Candidate.PeerLeft)
	// on the worker that got their first token / finished after its last scrape: the
	// scrape still counts them waiting / running, but they are neither booked so nor
	// foreign.
	leftWaiting, leftRunning int
	// adapter is the prior time the request's LoRA adapter adds on the worker, seconds
	// (adapterCost); 0 for a base-model request or an adapter already loaded.
	adapter float64
	// decode is the worker's expected decode time of a running request (first token to
	// completion), seconds (workerModel.decodeAt); 0 unknown.
	decode float64
}

// features computes one candidate's terms under prior p, and the cached tokens the
// prefill term counted (CachedTokens less what the queue ahead evicts, overload.go).
func features(o *Options, in *Input, c *Candidate, p prior, v workerView) (Features, int) {
	var f Features
	f[TermOverhead] = p.overhead

	queueTok := queueTokens(o, in, c, v)
	prompt := max(in.PromptTokens, 0)
	cached := min(max(c.CachedTokens, 0), prompt)
	if o.EvictDuringWait {
		cached = keptAfterWait(in, c, cached, queueTok)
	}
	uncached := float64(prompt - cached)
	f[TermPrefill] = uncached / p.prefillRate

	// Lower-tier hits cost a transfer, not zero (Mooncake §4: KVCache loaded from
	// CPU/SSD is on the TTFT path). ByTier counts blocks; scale to the capped CachedTokens.
	if bt := c.Cached.ByTier; c.Cached.Blocks > 0 && cached > 0 {
		lower := bt[kvindex.TierCPU] + bt[kvindex.TierDisk] + bt[kvindex.TierOther]
		if lower > 0 {
			per := float64(cached) / float64(c.Cached.Blocks) // tokens per held block, after the cap
			f[TermLowerTier] = float64(bt[kvindex.TierCPU])*per/p.cpuRate +
				float64(bt[kvindex.TierDisk]+bt[kvindex.TierOther])*per/p.diskRate
		}
	}

	f[TermQueue] = queueTok / p.prefillRate
	if o.KVWait {
		f[TermQueue] = max(f[TermQueue], kvWait(in, c, v, queueTok+uncached))
	}
	f[TermAdapter] = v.adapter

	// Decode interference: each engine step schedules running decodes first (one token
	// each) and fills the rest of max_num_batched_tokens with prefill chunks, so each
	// running sequence lengthens every step our prefill (and the queue ahead) needs.
	running := float64(max(c.Booked.Decoding, 0))
	if w := loadWeight(c.Load.ScrapedAt, in.Now, o.LoadHalfLife); w > 0 {
		if extra := c.Load.Running - float64(c.Booked.Requests+v.leftRunning); extra > 0 {
			running += w * extra
		}
	}
	if running > 0 {
		steps := max(1, (queueTok+uncached)/float64(o.BatchTokens))
		f[TermDecode] = running * steps * p.decodePerStep
	}
	return f, cached
}

// queueTokens is the prefill work queued ahead of a request on c, tokens.
//
// vLLM v1's scheduler serves the waiting queue FCFS (vllm/v1/core/sched/scheduler.py:
// running requests first, then waiting ones in order), so every uncached token queued
// ahead is prefilled before ours. Our own bookings are exact in size; with
// Options.QueueBacklog what is left of them is the worker's backlog (v.backlog, a
// Lindley recursion over our picks at the learned prefill rate, overload.go), never
// more than their full uncached tokens: the head of a deep queue is partly done, the
// rest is not. Otherwise they count in full and θ₂ learns the bias. Token-less bookings (Booked.Unsized) and the scraped waiting
// requests we did not route count at their expected size F_w, the scrape discounted by
// its age; bookings made after the scrape are not double counted (only waiting requests
// beyond our prefilling bookings are foreign), nor are ours that left the queue after
// the scrape (v.leftWaiting): a 1 s old scrape of a busy worker otherwise shows
// several phantom foreign requests, each priced at F_w.
func queueTokens(o *Options, in *Input, c *Candidate, v workerView) float64 {
	q := float64(max(c.Booked.PrefillTokens, 0))
	if v.backlog >= 0 {
		q = min(q, v.backlog)
	}
	q += float64(max(c.Booked.Unsized, 0)) * v.foreignTokens
	if w := loadWeight(c.Load.ScrapedAt, in.Now, o.LoadHalfLife); w > 0 {
		if extra := c.Load.Waiting - float64(c.Booked.Prefilling+v.leftWaiting); extra > 0 {
			q += w * extra * v.foreignTokens
		}
	}
	return q
}

// kvWait is how long a request needing need more KV tokens (the uncached tokens queued
// ahead of it and its own) waits on c for running requests to free blocks, seconds:
//
//	wait = D × (U·C + need − C) ÷ C    when positive, else 0
//
// with C = BlockCapacity × BlockSize the worker's KV capacity in tokens, U its scraped
// KV usage (vllm:kv_cache_usage_perc: referenced blocks; free and cached-unreferenced
// blocks are reusable) and D its decode time (v.decode): the running requests hold U·C
// and, finishing over about D, free the cache at C ÷ D tokens per second at most.
// vLLM v1 schedules a waiting request only when the KV manager can allocate its blocks
// (vllm/v1/core/sched/scheduler.py, allocate_slots returning None stops the waiting
// loop), so this wait, not the prefill rate, bounds a KV-full worker's queue. 0 without
// a scrape, a capacity or a decode time.
func kvWait(in *Input, c *Candidate, v workerView, need float64) float64 {
	if v.decode <= 0 || c.Worker == nil || c.Load.ScrapedAt.IsZero() || in.BlockSize <= 0 {
		return 0
	}
	capTok := float64(c.Worker.Profile.BlockCapacity) * float64(in.BlockSize)
	if capTok <= 0 {
		return 0
	}
	used := min(max(c.Load.KVUsage, 0), 1) * capTok
	excess := used + max(need, 0) - capTok
	if excess <= 0 {
		return 0
	}
	return v.decode * excess / capTok
}

// decodeAlpha is the EWMA weight of one completion in workerModel.decode (≈ last 10).
const decodeAlpha = 0.1

// decodeAt is the worker's expected decode time at now, seconds: the EWMA of completed
// requests' decode times; before any completed, while some of ours decode there, the
// time since the first of them got its first token (a censored lower bound: none has
// finished in that time); 0 when nothing is known.
func (wm *workerModel) decodeAt(now time.Time, decoding int) float64 {
	if wm.decode > 0 {
		return wm.decode
	}
	if decoding > 0 && !wm.firstDecode.IsZero() && now.After(wm.firstDecode) {
		return now.Sub(wm.firstDecode).Seconds()
	}
	return 0
}

// MaxPredictedTerm bounds each term of a Prediction (Overhead, Prefill, Queue), so a
// TTFT is at most 3 × MaxPredictedTerm and never overflows.
const MaxPredictedTerm = 24 * time.Hour

// predict turns features and factors into a Prediction.
func predict(f Features, theta *[NumTerms]float64) Prediction {
	var t [NumTerms]float64
	for i := range t {
		t[i] = theta[i] * f[i]
	}
	// Saturating (satDuration): a term past ±MaxPredictedTerm (an absurd load, a claim
	// no worker could hold) is that bound, never an int64 overflow that turns a huge
	// delay into a large negative one; NaN counts as the bound too.
	sec := satDuration
	p := Prediction{Overhead: sec(t[TermOverhead]), Prefill: sec(t[TermPrefill] + t[TermLowerTier]),
		Queue: sec(t[TermQueue] + t[TermDecode]), Adapter: sec(t[TermAdapter]), Features: f}
	p.TTFT = p.Overhead + p.Prefill + p.Queue + p.Adapter
	return p
}

// satDuration converts seconds to a Duration, saturating at ±MaxPredictedTerm (NaN
// counts as the bound), as predict does for every term.
func satDuration(s float64) time.Duration {
	switch {
	case s >= MaxPredictedTerm.Seconds() || s != s:
		return MaxPredictedTerm
	case s <= -MaxPredictedTerm.Seconds():
		return -MaxPredictedTerm
	}
	return time.Duration(s * float64(time.Second))
}

var unitTheta = [NumTerms]float64{1, 1, 1, 1, 1, 1}
