package scoring

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute/metrics"
)

// ErrUnknownPolicy is returned by New for a name not in PolicyNames.
var ErrUnknownPolicy = errors.New("scoring: unknown policy")

// DefaultBatchTokens is vLLM's default --max-num-batched-tokens for online serving
// (tokens per engine step): Options.BatchTokens and router.Saturation take it for 0.
const DefaultBatchTokens = 8192

// Options are the settings every policy constructor receives. Zero values take the
// default documented per field (set in one place: Options.withDefaults); a negative
// value disables a feature where the field says so.
type Options struct {
	// PrefillTokensPerSecond is the prior prefill rate for workers whose Profile has
	// none, uncached tokens per second. 0 → 5000.
	PrefillTokensPerSecond float64
	// Overhead is the prior fixed per-request time for workers whose Profile has none.
	// 0 → 20 ms.
	Overhead time.Duration
	// CPUTierTokensPerSecond is the prior rate at which KV held in the CPU tier (vLLM
	// KV offloading, medium "CPU") is brought back to the GPU, tokens per second.
	// 0 → 100000 (≈13 GB/s of PCIe for 128 KiB of KV per token, an 8B-class model).
	CPUTierTokensPerSecond float64
	// DiskTierTokensPerSecond is the same for the disk (and any other) tier. 0 → 20000.
	DiskTierTokensPerSecond float64
	// DecodeInterference is the prior extra time each running sequence adds to one
	// engine step that carries prefill work (vLLM v1 batches decodes with prefill chunks
	// under max_num_batched_tokens). 0 → 200 µs.
	DecodeInterference time.Duration
	// BatchTokens is the engine's token budget per step (vLLM --max-num-batched-tokens),
	// tokens; it turns queued prefill tokens into engine steps. 0 → DefaultBatchTokens.
	BatchTokens int
	// ForeignRequestTokens is the prior size of a waiting request kvroute did not route
	// (seen only in the scraped vllm:num_requests_waiting), uncached tokens; learned per
	// worker from the requests kvroute routes. 0 → 1024.
	ForeignRequestTokens int
	// LoadHalfLife is the age at which a scraped load counts half; older scrapes count
	// less (weight 0.5^(age/half-life)). 0 → 2 s; negative → scraped load is ignored.
	LoadHalfLife time.Duration

	// TieMargin is the relative near-tie margin: workers predicted within
	// best×(1+TieMargin) (or best+TieMarginMin, whichever is larger) are ties, broken by
	// fewest in-flight tokens, then at random. 0 → 0.02; negative → exact ties only.
	TieMargin float64
	// TieMarginMin is the absolute near-tie margin. 0 → 1 ms.
	TieMarginMin time.Duration
	// WriteHalfLife is the half-life of each worker's recent cache writes (uncached
	// prompt tokens kvroute sent it), the near-tie break that places new prefixes where
	// the cache turns over slowest (its LRU victim is oldest). 0 → 30 s.
	WriteHalfLife time.Duration
	// CongestionMax caps the congestion factor ρ/(1−ρ) that turns a pick's prefill
	// seconds into the delay they impose on later requests (README "Overload"; ρ = the
	// cluster's offered prefill utilization). 0 → 8; negative → off (TTFT alone decides).
	CongestionMax float64
	// QueueBacklog counts kvroute's bookings on a worker at their remaining prefill work
	// (the Lindley backlog at the learned rate, bounded by the bookings and by the
	// bookings less the head of the queue; README "Overload") instead of in full. Off by
	// default: measured +10 % p90 at overload (Mooncake 3×) but −30 % on KV-bound
	// multi-turn chat (BENCHMARKS.md, "Scoring under overload").
	QueueBacklog bool
	// EvictDuringWait discounts a worker's cached prefix by the blocks its queue ahead
	// writes before the request is scheduled (README "Overload", keptAfterWait). Off by
	// default: the model ignores that requests queued ahead which share the prefix keep
	// it referenced and re-touched, so in deep queues it called every hot prefix
	// evicted, routed cache-blind, recomputed, deepened the queues — a positive feedback
	// (Zipf 1.2 at 4 req/s: p90 68 s with it, 3.6 s without; BENCHMARKS.md).
	EvictDuringWait bool
	// PeerState counts what peer replicas report of a worker's state besides their
	// bookings: their requests that left it after its scrape (Candidate.PeerLeft) and
	// their decayed cache writes to it (Candidate.PeerWrites, in the write tie-break
	// and the offered utilization ρ). With an exchange that reaches the peers before
	// the next pick, N replicas then decide as one (BENCHMARKS.md "Replicas"). Off by
	// default: with the real exchange (up to an interval late) picks made within one
	// interval all see the same state and pile onto the same worker, where replicas
	// that each saw only their own writes spread by accident (Mooncake p90 3.55 s →
	// 4.40 s with it).
	PeerState bool
	// CacheTurnover adds to each candidate's cost the expected re-prefill of the prompt's
	// context if the worker's cache turns over before the context is reused: (1+κ) ×
	// exp(−T_w/τ) × prompt tokens ÷ the worker's prefill rate, T_w = cache tokens ÷ write
	// rate (Che's approximation of LRU), τ = the measured reuse interval of prompts
	// (README "Cache turnover", turnover.go).
	CacheTurnover bool
	// UtilizationBacklog scales the cluster utilization ρ behind the congestion price by
	// the backlog factor max(1, O/S): O the decayed uncached tokens routed, S those of
	// them whose prefill is done (README "Overload"). Off by default: on the Mooncake
	// trace at 3× it lifts κ to its cap (p90 139 → 129 s), but in front of the QoS queue
	// at overload the κ-priced pick keeps choosing the saturated cache holder, which the
	// queue then holds (bench TestQoSFairnessAndPriorityVirtual: throughput 0.92×,
	// goodput 0.70× of no queue), and multi-turn at 1 conv/s moved 0.99 → 1.05 ÷ static.
	UtilizationBacklog bool
	// KVWait prices a worker whose KV cache cannot hold the request: the queue term is
	// at least the time its running requests take to free the blocks the queue ahead and
	// the request need, D × (used + queued + uncached − capacity) ÷ capacity, with D the
	// worker's learned decode time (model.go kvWait). A vLLM engine whose KV cache is
	// full schedules no waiting request until blocks free, whatever its prefill rate, so
	// without it a KV-bound worker's queue is priced as compute it can start at once.
	// Needs scraped KV usage (vllm:kv_cache_usage_perc) and the worker profile's
	// block_capacity.
	KVWait bool
	// AdapterLoadTime is the prior time a worker takes to load a LoRA adapter that is
	// not in one of its slots (from its CPU cache or disk) before the request's first
	// step; the prediction adds it where the worker's vllm:lora_requests_info says the
	// adapter is not loaded (adapter.go), and learns its factor per worker. 0 → 200 ms.
	AdapterLoadTime time.Duration
	// AdapterSlotWait is the prior wait for a slot when every one of a worker's
	// max_loras slots holds an adapter with running requests (vLLM schedules no request
	// of a further adapter until one of them ends), added to AdapterLoadTime. 0 → 2 s.
	AdapterSlotWait time.Duration
	// KVBytesPerToken is the KV cache size of one token for models whose
	// Input.KVBytesPerToken is 0, bytes. 0 → 131072 (128 KiB: 2 × 32 layers × 8 KV
	// heads × 128 head dim × 2 bytes, Llama-3.1-8B in bf16).
	KVBytesPerToken float64
	// KVTransferBytesPerSecond is the prefill→decode KV transfer bandwidth of a
	// disaggregated pair (vLLM's NixlConnector reads the prefill worker's blocks over
	// RDMA), bytes per second. 0 → 25e9 (a 200 Gb/s link).
	KVTransferBytesPerSecond float64
	// KVTransferLearnWeight, in (0, 1], learns the transfer bandwidth from observed
	// transfers (TransferLearner): each moves the bandwidth in use by this weight toward
	// the observed bytes ÷ (decode first token − prefill end − the prediction's other
	// terms), kept within [KVTransferBytesPerSecond ÷ 8, KVTransferBytesPerSecond × 8].
	// ≤ 0 (the default): the configured bandwidth is used as is.
	KVTransferLearnWeight float64
	// KVTransferLatency is the fixed time of one KV transfer (the decode worker's
	// read request and its completion notice). 0 → 2 ms.
	KVTransferLatency time.Duration
	// PDMaxLocalPrefillTokens caps the uncached prompt a decode-role worker may prefill
	// itself instead of using a prefill worker, tokens, even when that is predicted
	// faster: a long local prefill stalls the worker's running decodes (their ITL).
	// Dynamo's conditional disaggregation uses the same cap, max_local_prefill_length
	// (examples/python_rs/llm/vllm_nixl/router/disagg_router.py). 0 → 1000; negative
	// → no cap (the prediction alone decides).
	PDMaxLocalPrefillTokens int
	// MaxTTFT sheds a request (429) when even the best prediction exceeds it. 0 → off.
	MaxTTFT time.Duration
	// ShedOnSLOMiss sheds a request whose SLO (x-slo-ttft-ms) no worker is predicted to meet.
	ShedOnSLOMiss bool
	// RetryAfterMax caps the Retry-After of a shed request. 0 → 30 s.
	RetryAfterMax time.Duration

	// Forgetting is the recursive-least-squares forgetting factor λ in (0,1]: an
	// observation's weight decays by λ per later observation (effective memory
	// ≈ 1/(1−λ) observations). 0 → 0.99.
	Forgetting float64
	// ClampFactor bounds every learned coefficient to [prior/ClampFactor,
	// prior×ClampFactor]. 0 → 20.
	ClampFactor float64
	// FactorHalfLife is how fast an unobserved worker's learned factors decay back to the
	// pool's: the variance of its own estimate doubles every FactorHalfLife without an
	// observation (README "Learning"). 0 → 60 s; negative → no decay.
	FactorHalfLife time.Duration
	// ExploreFraction is the share of picks made with the pool's factors instead of each
	// worker's own (among the workers the pool's model calls near-best), so that a worker
	// whose learned factors are too pessimistic is still observed. 0 → 0.01; negative → 0.
	ExploreFraction float64
	// ResidualClip bounds one observation's relative residual |1 − predicted/observed|
	// used for learning (Huber-style robustness to stalls and outliers). 0 → 0.5.
	ResidualClip float64

	Baselines Baselines

	// Rand is the random source for tie-breaks and random baselines. nil: a randomly
	// seeded source; tests and simulations inject a seeded one. Used only inside Pick
	// (which the router serializes); *rand.Rand is not safe for concurrent use, so give
	// each policy that may pick concurrently with another its own.
	Rand *rand.Rand
	// Metrics receives scoring metrics; nil: none exported.
	Metrics *metrics.Scoring
	// Logger receives, at debug level, each kvroute decision with the chosen worker's
	// terms (guarded by Enabled, so it costs nothing otherwise); nil: no logging.
	Logger *slog.Logger
}

// Baselines configures the comparison policies. Zero values take the defaults of the
// documentation each policy cites.
type Baselines struct {
	// GIE approximate prefix (llm-d/Gateway API Inference Extension docs):
	GIEBlockChars     int     // characters per hashed block (≈16 tokens × 4 chars); 0 → 64
	GIEMaxBlocks      int     // blocks of a prompt considered; 0 → 256
	GIELRUBlocks      int     // LRU capacity per worker, blocks; 0 → 31250
	GIEPrefixWeight   float64 // 0 → 3
	GIEQueueWeight    float64 // 0 → 2
	GIEKVWeight       float64 // 0 → 2
	SaturationQueue   float64 // llm-d: waiting requests at which a worker is saturated; 0 → 5
	SaturationKV      float64 // llm-d: KV usage fraction at which a worker is saturated; 0 → 0.8
	SaturationTokens  int     // llm-d: in-flight uncached prefill tokens at which a worker is saturated; 0 → 32768
	DynamoOverlap     float64 // Dynamo kv-overlap-score-weight; 0 → 1; negative → 0 (pure load)
	DynamoTemperature float64 // Dynamo router-temperature; 0 → argmin
	SGLCacheThreshold float64 // SGLang cache_threshold (match ratio); 0 → 0.3
	SGLBalanceAbs     float64 // SGLang balance_abs_threshold (requests); 0 → 64
	SGLBalanceRel     float64 // SGLang balance_rel_threshold; 0 → 1.5
	SGLMaxTreeChars   int     // SGLang max tree size per worker, characters; 0 → 1<<24
	// PDNonCachedTokens is llm-d's P/D decider threshold (prefix-based-pd-decider
	// nonCachedTokens): a request whose uncached prompt on the chosen decode worker is at
	// least this many tokens is disaggregated; 0 → 1024; negative → always.
	PDNonCachedTokens int
}

// DefaultOptions returns the value each zero field of Options takes (Rand and Metrics
// stay nil). config.Default takes its scoring section from it, so each default is
// written once, in withDefaults.
func DefaultOptions() Options {
	o := Options{Rand: rand.New(rand.NewPCG(0, 0))}.withDefaults()
	o.Rand = nil
	return o
}

func (o Options) withDefaults() Options {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	defI := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.PrefillTokensPerSecond, 5000)
	defD(&o.Overhead, 20*time.Millisecond)
	def(&o.CPUTierTokensPerSecond, 100000)
	def(&o.DiskTierTokensPerSecond, 20000)
	defD(&o.DecodeInterference, 200*time.Microsecond)
	defI(&o.BatchTokens, DefaultBatchTokens)
	defI(&o.ForeignRequestTokens, 1024)
	defD(&o.LoadHalfLife, 2*time.Second)
	defD(&o.AdapterLoadTime, 200*time.Millisecond)
	defD(&o.AdapterSlotWait, 2*time.Second)
	def(&o.TieMargin, 0.10)
	if o.TieMargin < 0 {
		o.TieMargin = 0
	}
	defD(&o.TieMarginMin, time.Millisecond)
	defD(&o.WriteHalfLife, 30*time.Second)
	defD(&o.RetryAfterMax, 30*time.Second)
	def(&o.Forgetting, 0.99)
	o.Forgetting = min(o.Forgetting, 1)
	def(&o.ClampFactor, 20)
	def(&o.ResidualClip, 0.5)
	defD(&o.FactorHalfLife, time.Minute)
	def(&o.ExploreFraction, 0.01)
	o.ExploreFraction = min(max(o.ExploreFraction, 0), 1)
	def(&o.CongestionMax, 8)
	def(&o.KVBytesPerToken, 131072)
	def(&o.KVTransferBytesPerSecond, 25e9)
	defD(&o.KVTransferLatency, 2*time.Millisecond)
	if o.PDMaxLocalPrefillTokens == 0 {
		o.PDMaxLocalPrefillTokens = 1000
	}
	b := &o.Baselines
	defI(&b.GIEBlockChars, 64)
	defI(&b.GIEMaxBlocks, 256)
	defI(&b.GIELRUBlocks, 31250)
	def(&b.GIEPrefixWeight, 3)
	def(&b.GIEQueueWeight, 2)
	def(&b.GIEKVWeight, 2)
	def(&b.SaturationQueue, 5)
	def(&b.SaturationKV, 0.8)
	defI(&b.SaturationTokens, 32768)
	def(&b.DynamoOverlap, 1)
	if b.DynamoOverlap < 0 {
		b.DynamoOverlap = 0
	}
	def(&b.SGLCacheThreshold, 0.3)
	def(&b.SGLBalanceAbs, 64)
	def(&b.SGLBalanceRel, 1.5)
	defI(&b.SGLMaxTreeChars, 1<<24)
	if b.PDNonCachedTokens == 0 {
		b.PDNonCachedTokens = 1024
	}
	if o.Rand == nil {
		o.Rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	return o
}

// Policy names (scoring.policy values).
const (
	PolicyKVRoute       = "kvroute"        // predicted TTFT, learned online (the default)
	PolicyKVRouteStatic = "kvroute_static" // predicted TTFT with prior coefficients only (ablation)
	PolicyRandom        = "random"
	PolicyRoundRobin    = "round_robin"
	PolicyLeastRequest  = "least_request"
	PolicyGIE           = "gie_approx_prefix"
	PolicyLLMD          = "llmd_prefix_affinity"
	PolicyDynamo        = "dynamo"
	PolicySGLang        = "sglang_cache_aware"
	PolicyLoRAAffinity  = "llmd_lora_affinity" // llm-d/AIBrix adapter affinity in front of llmd_prefix_affinity
	PolicyLLMDPD        = "llmd_pd"            // llm-d's P/D profile handler (prefix-based decider), llmd_pd.go
)

// PolicyNames lists the names New accepts (scoring.policy values), kvroute first.
var PolicyNames = []string{PolicyKVRoute, PolicyKVRouteStatic, PolicyRandom, PolicyRoundRobin, PolicyLeastRequest,
	PolicyGIE, PolicyLLMD, PolicyDynamo, PolicySGLang, PolicyLoRAAffinity, PolicyLLMDPD}

// New returns a fresh policy named name (no goroutines, no clocks: time comes from
// Input.Now, randomness from Options.Rand). Errors wrap ErrUnknownPolicy.
func New(name string, o Options) (Policy, error) {
	o = o.withDefaults()
	switch name {
	case PolicyKVRoute:
		return NewPredictor(o, true), nil
	case PolicyKVRouteStatic:
		return NewPredictor(o, false), nil
	case PolicyRandom:
		return &Random{rng: o.Rand, m: o.Metrics}, nil
	case PolicyRoundRobin:
		return &RoundRobin{m: o.Metrics}, nil
	case PolicyLeastRequest:
		return &LeastRequest{rng: o.Rand, m: o.Metrics}, nil
	case PolicyGIE:
		return newGIE(o), nil
	case PolicyLLMD:
		return newLLMD(o), nil
	case PolicyDynamo:
		return newDynamo(o), nil
	case PolicySGLang:
		return newSGLang(o), nil
	case PolicyLoRAAffinity:
		return newLoRAAffinity(o), nil
	case PolicyLLMDPD:
		return newLLMDPD(o), nil
	}
	return nil, fmt.Errorf("%w %q (one of %v)", ErrUnknownPolicy, name, PolicyNames)
}
