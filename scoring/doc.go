// Package scoring predicts each worker's time to first token (TTFT) for a request, in
// seconds, learns from the first tokens it then observes, and picks a worker. It also
// holds the baseline policies kvroute is compared against. See README.md in this folder.
//
// # The model
//
// For request r on worker w (all terms in seconds):
//
//	TTFT(r,w) = θ₀·o_w                                    overhead
//	          + θ₁·U/ρ_w                                   prefill of the U uncached tokens
//	          + θ₃·(C_cpu/ρ_cpu + C_disk/ρ_disk)           lower-tier hits: transfer, not zero
//	          + θ₂·max(Q/ρ_w, K_w)                         prefill queued ahead (FCFS), or the KV wait
//	          + θ₄·R·max(1,(Q+U)/B)·δ                      decode interference
//	          + θ₅·A_w                                     loading the LoRA adapter (adapter.go)
//
//	U = prompt − cached (cached capped at prompt−1: vLLM always recomputes the last token,
//	    with evict_during_wait also less what the queue's writes evict first, overload.go)
//	Q = booked uncached tokens (or their remaining work, queue_backlog) + unsized bookings·F_w
//	    + w_age·max(0, waiting − booked prefilling − ours that left since the scrape)·F_w
//	K_w = D_w·max(0, u_w·C_w + Q + U − C_w)/C_w with kv_wait (else 0): the wait for running
//	    requests to free KV blocks; C_w = block_capacity·block size tokens, u_w the scraped
//	    KV usage, D_w the learned decode time (completion − first token, EWMA; model.go)
//	R = booked decoding + w_age·max(0, running − booked requests)
//	w_age = 0.5^(age of the scrape / load_half_life)
//	A_w = 0 (base model, or the adapter in a slot), adapter_load_time (a free slot, or an
//	    idle adapter evicted), adapter_load_time + adapter_slot_wait (every slot running)
//
// o_w, ρ_w come from the worker's profile (else scoring defaults), ρ_cpu, ρ_disk, δ
// and B (max_num_batched_tokens) from Options; F_w is the learned mean uncached size of
// requests on w, standing in for requests kvroute did not route. θ (one factor per
// term, 1 = the prior) is learned per worker by recursive least squares with
// forgetting on the relative error (learn.go), residuals clipped, covariance bounded,
// θ clamped to [1/clamp_factor, clamp_factor], and shrunk toward the pool's factors
// (empirical Bayes, decaying back to them while unobserved; pool.go).
//
// Sources. The queue term follows vLLM v1's scheduler (vllm/v1/core/sched/scheduler.py:
// running requests are scheduled first, one decode token each, then waiting requests
// FCFS, chunked under the max_num_batched_tokens budget), hence prefill work ahead adds
// linearly and every running sequence lengthens each step the prefill needs (the
// prefill–decode interference DistServe, OSDI '24, §2 measures). Prefill time linear in
// uncached tokens is the regime of chunked prefill at moderate context (Sarathi-Serve,
// OSDI '24); attention's quadratic part is absorbed by the learned θ₁. A lower-tier
// hit costs its transfer (Mooncake, FAST '25, §4: KVCache reused from CPU/SSD is
// loaded on the TTFT path). Predicting per-instance TTFT from prefix-cache hit and
// queued prefill work, rather than scoring them separately, is Preble's (ICLR '25)
// "global scheduler" cost and Mooncake's Conductor TTFT estimate; kvroute adds
// per-worker online calibration.
//
// # The pick
//
// The lowest cost wins: the predicted TTFT plus, when the cluster is loaded, the delay
// the pick's prefill imposes on later requests, κ·θ₁·U/ρ_w with κ = ρ/(1−ρ) of the
// cluster's offered prefill utilization ρ — the model's, with utilization_backlog
// (off by default) scaled up by offered ÷ served prefill tokens when first tokens fall
// behind the writes (overload.go; README "Overload"). Costs
// within the near-tie margin (default 10 %, about the spread of learned factors between
// identical workers) are broken by what the
// TTFT of this request does not show, its cost to later ones: the least prefill work
// for this request (a prefix cached or being prefilled more than one engine step ahead
// is not recomputed elsewhere: vLLM v1 caches a block only once computed,
// vllm/v1/core/kv_cache_manager.py, so a request scheduled in the same step as the
// prefill recomputes it), then fewest booked prefill tokens, then fewest recent cache
// writes (a new prefix evicts the oldest LRU blocks where the cache turns over slowest;
// SGLang's cache-aware router sends misses to the smallest tree for the same reason),
// then fewest booked requests, then at random.
//
// # Concurrency
//
// The router calls Policy.Pick with its lock held, so a burst of requests is decided
// one at a time against the bookings of those before it; Learner.Observe may run
// concurrently with Pick. Constructors start no goroutines and read no clock (time comes
// from Input.Now; randomness from Options.Rand), so simulations in virtual time replay.
package scoring
