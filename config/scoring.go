package config

import (
	"slices"
	"time"

	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// Scoring configures the TTFT predictor, the picker, the baselines and the vLLM
// /metrics scraper. The meaning of each value (and of 0 where a default applies) is
// documented on scoring.Options; the defaults come from scoring.DefaultOptions.
type Scoring struct {
	// Policy selects the picker: "kvroute" (predicted TTFT, learned) or one of
	// scoring.PolicyNames (kvroute_static, baselines).
	Policy string `mapstructure:"policy"`
	// PrefillTokensPerSecond is the prior prefill rate for workers without a profile.
	PrefillTokensPerSecond float64 `mapstructure:"prefill_tokens_per_second"`
	// Overhead is the prior fixed per-request time for workers without a profile.
	Overhead time.Duration `mapstructure:"overhead"`
	// CPUTierTokensPerSecond / DiskTierTokensPerSecond: prior rates of bringing
	// lower-tier cached KV back to the GPU, tokens/s.
	CPUTierTokensPerSecond  float64 `mapstructure:"cpu_tier_tokens_per_second"`
	DiskTierTokensPerSecond float64 `mapstructure:"disk_tier_tokens_per_second"`
	// DecodeInterference is the prior extra step time per running sequence.
	DecodeInterference time.Duration `mapstructure:"decode_interference"`
	// BatchTokens is vLLM's --max-num-batched-tokens, tokens per engine step; also the
	// saturation point of admission's queue (router.Saturation.BatchTokens).
	BatchTokens int `mapstructure:"batch_tokens"`
	// ForeignRequestTokens is the prior size of a waiting request kvroute did not route.
	ForeignRequestTokens int `mapstructure:"foreign_request_tokens"`
	// LoadHalfLife: a scraped load this old counts half; negative ignores scraped load.
	LoadHalfLife time.Duration `mapstructure:"load_half_life"`
	// TieMargin (relative) and TieMarginMin (absolute) define near-ties.
	TieMargin    float64       `mapstructure:"tie_margin"`
	TieMarginMin time.Duration `mapstructure:"tie_margin_min"`
	// WriteHalfLife: half-life of each worker's recent cache writes (the near-tie break
	// that places new prefixes where the cache turns over slowest).
	WriteHalfLife time.Duration `mapstructure:"write_half_life"`
	// AdapterLoadTime is the prior time a worker takes to load a LoRA adapter it does
	// not hold; AdapterSlotWait the prior wait for a slot when all its max_loras slots
	// hold adapters with running requests (scoring/adapter.go).
	AdapterLoadTime time.Duration `mapstructure:"adapter_load_time"`
	AdapterSlotWait time.Duration `mapstructure:"adapter_slot_wait"`
	// KVBytesPerToken is the KV cache per token of models without their own
	// (models[].kv_bytes_per_token or shape), bytes; KVTransferBytesPerSecond and
	// KVTransferLatency the prefill→decode transfer link; PDMaxLocalPrefillTokens the
	// longest uncached prompt a decode-role worker prefills itself (docs/pd.md).
	KVBytesPerToken          float64       `mapstructure:"kv_bytes_per_token"`
	KVTransferBytesPerSecond float64       `mapstructure:"kv_transfer_bytes_per_second"`
	KVTransferLatency        time.Duration `mapstructure:"kv_transfer_latency"`
	PDMaxLocalPrefillTokens  int           `mapstructure:"pd_max_local_prefill_tokens"`
	// KVTransferLearnWeight, in [0, 1], learns the transfer bandwidth from observed
	// transfers (an EWMA of this weight, within 1/8× to 8× the configured one); 0 off.
	KVTransferLearnWeight float64 `mapstructure:"kv_transfer_learn_weight"`
	// MaxTTFT sheds (429) requests whose best prediction exceeds it; 0 disables.
	MaxTTFT time.Duration `mapstructure:"max_ttft"`
	// ShedOnSLOMiss sheds requests whose x-slo-ttft-ms no worker is predicted to meet.
	ShedOnSLOMiss bool `mapstructure:"shed_on_slo_miss"`
	// RetryAfterMax caps Retry-After of shed requests.
	RetryAfterMax time.Duration `mapstructure:"retry_after_max"`
	// Forgetting (RLS λ in (0,1]), ClampFactor (> 1) and ResidualClip (> 0) bound learning.
	Forgetting   float64 `mapstructure:"forgetting"`
	ClampFactor  float64 `mapstructure:"clamp_factor"`
	ResidualClip float64 `mapstructure:"residual_clip"`
	// CongestionMax caps ρ/(1−ρ), the weight of a pick's prefill in its cost under load
	// (scoring README "Overload"); 0 disables the term.
	CongestionMax float64 `mapstructure:"congestion_max"`
	// FactorHalfLife: an unobserved worker's learned deviation from the pool's factors
	// halves this often; 0 disables the decay.
	FactorHalfLife time.Duration `mapstructure:"factor_half_life"`
	// ExploreFraction of picks re-decided with the pool's factors (exploration floor);
	// 0 disables it.
	ExploreFraction float64 `mapstructure:"explore_fraction"`
	// QueueBacklog counts bookings at their remaining prefill work (Lindley backlog).
	QueueBacklog bool `mapstructure:"queue_backlog"`
	// EvictDuringWait discounts cached prefixes by what the queue ahead writes first
	// (off by default: a positive feedback in deep queues, scoring README "Overload").
	EvictDuringWait bool `mapstructure:"evict_during_wait"`
	// PeerState counts peer replicas' requests that left a worker since its scrape and
	// their cache writes there (off by default: same-instant picks on different replicas
	// then agree and collide, BENCHMARKS.md "Replicas"; scoring.Options.PeerState).
	PeerState bool `mapstructure:"peer_state"`
	// CacheTurnover prices the expected re-prefill of a prompt's context on a worker whose
	// prefix cache turns over faster than contexts are reused (Che's approximation of LRU;
	// off by default, scoring README "Cache turnover").
	CacheTurnover bool `mapstructure:"cache_turnover"`
	// UtilizationBacklog scales the utilization ρ by offered ÷ served tokens (off by
	// default; scoring.Options.UtilizationBacklog).
	UtilizationBacklog bool `mapstructure:"utilization_backlog"`
	// KVWait prices a KV-full worker's queue by the time its running requests take to
	// free the blocks the request needs (scoring.Options.KVWait; needs scraped KV usage
	// and the workers' block_capacity).
	KVWait bool `mapstructure:"kv_wait"`

	Baselines ScoringBaselines `mapstructure:"baselines"`
	Scrape    Scrape           `mapstructure:"scrape"`
}

// ScoringBaselines tunes the comparison policies (see scoring.Baselines).
type ScoringBaselines struct {
	DynamoOverlapWeight float64 `mapstructure:"dynamo_overlap_weight"`
	DynamoTemperature   float64 `mapstructure:"dynamo_temperature"`
	SGLCacheThreshold   float64 `mapstructure:"sglang_cache_threshold"`
	SGLBalanceAbs       float64 `mapstructure:"sglang_balance_abs_threshold"`
	SGLBalanceRel       float64 `mapstructure:"sglang_balance_rel_threshold"`
	SaturationQueue     float64 `mapstructure:"llmd_saturation_queue"`
	SaturationKV        float64 `mapstructure:"llmd_saturation_kv"`
	SaturationTokens    int     `mapstructure:"llmd_saturation_tokens"`
	GIEBlockChars       int     `mapstructure:"gie_block_chars"`
	PDNonCachedTokens   int     `mapstructure:"llmd_pd_non_cached_tokens"`
}

// Scrape configures polling each worker's vLLM GET /metrics.
type Scrape struct {
	// Interval between scrapes of every worker; 0 disables scraping (no load, no
	// scrape-based health).
	Interval time.Duration `mapstructure:"interval"`
	// Timeout of one scrape; 0 → min(interval, 5s).
	Timeout time.Duration `mapstructure:"timeout"`
	// FailuresBeforeUnhealthy consecutive failures mark a worker unhealthy. A timeout
	// while kvroute itself ran ≥ timeout/10 late (its heartbeat lag) is inconclusive and
	// does not count: a router starved of CPU does not mark instant workers down.
	FailuresBeforeUnhealthy int `mapstructure:"failures_before_unhealthy"`
}

// defaultScoring takes every default from scoring.DefaultOptions and workers' scrape
// defaults: each is written once, in the package that uses it.
func defaultScoring() Scoring {
	d := scoring.DefaultOptions()
	b := d.Baselines
	return Scoring{Policy: scoring.PolicyKVRoute, PrefillTokensPerSecond: d.PrefillTokensPerSecond, Overhead: d.Overhead,
		CPUTierTokensPerSecond: d.CPUTierTokensPerSecond, DiskTierTokensPerSecond: d.DiskTierTokensPerSecond,
		DecodeInterference: d.DecodeInterference, BatchTokens: d.BatchTokens, ForeignRequestTokens: d.ForeignRequestTokens,
		LoadHalfLife: d.LoadHalfLife, AdapterLoadTime: d.AdapterLoadTime, AdapterSlotWait: d.AdapterSlotWait, TieMargin: d.TieMargin, TieMarginMin: d.TieMarginMin, WriteHalfLife: d.WriteHalfLife,
		RetryAfterMax: d.RetryAfterMax, Forgetting: d.Forgetting, ClampFactor: d.ClampFactor, ResidualClip: d.ResidualClip,
		CongestionMax: d.CongestionMax, FactorHalfLife: d.FactorHalfLife, ExploreFraction: d.ExploreFraction,
		Baselines: ScoringBaselines{DynamoOverlapWeight: b.DynamoOverlap, SGLCacheThreshold: b.SGLCacheThreshold,
			SGLBalanceAbs: b.SGLBalanceAbs, SGLBalanceRel: b.SGLBalanceRel, SaturationQueue: b.SaturationQueue,
			SaturationKV: b.SaturationKV, SaturationTokens: b.SaturationTokens, GIEBlockChars: b.GIEBlockChars, PDNonCachedTokens: b.PDNonCachedTokens},
		KVBytesPerToken: d.KVBytesPerToken, KVTransferBytesPerSecond: d.KVTransferBytesPerSecond, KVTransferLatency: d.KVTransferLatency,
		PDMaxLocalPrefillTokens: d.PDMaxLocalPrefillTokens,
		Scrape:                  Scrape{Interval: workers.DefaultScrapeInterval, FailuresBeforeUnhealthy: workers.DefaultFailuresBeforeUnhealthy},
	}
}

// Options converts the section to scoring.Options (Rand and Metrics are the caller's).
func (s Scoring) Options() scoring.Options {
	dyn := s.Baselines.DynamoOverlapWeight
	if dyn == 0 {
		dyn = -1 // scoring: negative = weight 0 (pure load); 0 there means "default"
	}
	return scoring.Options{PrefillTokensPerSecond: s.PrefillTokensPerSecond, Overhead: s.Overhead,
		CPUTierTokensPerSecond: s.CPUTierTokensPerSecond, DiskTierTokensPerSecond: s.DiskTierTokensPerSecond,
		DecodeInterference: s.DecodeInterference, BatchTokens: s.BatchTokens, ForeignRequestTokens: s.ForeignRequestTokens,
		LoadHalfLife: s.LoadHalfLife, AdapterLoadTime: s.AdapterLoadTime, AdapterSlotWait: s.AdapterSlotWait, TieMargin: tieMargin(s.TieMargin), TieMarginMin: s.TieMarginMin, WriteHalfLife: s.WriteHalfLife, MaxTTFT: s.MaxTTFT,
		ShedOnSLOMiss: s.ShedOnSLOMiss, RetryAfterMax: s.RetryAfterMax, Forgetting: s.Forgetting, ClampFactor: s.ClampFactor,
		ResidualClip: s.ResidualClip, CongestionMax: offIfZero(s.CongestionMax), FactorHalfLife: offIfZeroD(s.FactorHalfLife),
		ExploreFraction: offIfZero(s.ExploreFraction), QueueBacklog: s.QueueBacklog, EvictDuringWait: s.EvictDuringWait, PeerState: s.PeerState,
		CacheTurnover: s.CacheTurnover, UtilizationBacklog: s.UtilizationBacklog, KVWait: s.KVWait,
		Baselines: scoring.Baselines{DynamoOverlap: dyn, DynamoTemperature: s.Baselines.DynamoTemperature,
			SGLCacheThreshold: s.Baselines.SGLCacheThreshold, SGLBalanceAbs: s.Baselines.SGLBalanceAbs, SGLBalanceRel: s.Baselines.SGLBalanceRel,
			SaturationQueue: s.Baselines.SaturationQueue, SaturationKV: s.Baselines.SaturationKV, SaturationTokens: s.Baselines.SaturationTokens,
			GIEBlockChars: s.Baselines.GIEBlockChars, PDNonCachedTokens: s.Baselines.PDNonCachedTokens},
		KVBytesPerToken: s.KVBytesPerToken, KVTransferBytesPerSecond: s.KVTransferBytesPerSecond, KVTransferLatency: s.KVTransferLatency,
		PDMaxLocalPrefillTokens: s.PDMaxLocalPrefillTokens, KVTransferLearnWeight: s.KVTransferLearnWeight,
	}
}

// offIfZero / offIfZeroD map the config's 0 ("off") to scoring's negative sentinel.
func offIfZero(v float64) float64 {
	if v == 0 {
		return -1
	}
	return v
}

func offIfZeroD(v time.Duration) time.Duration {
	if v == 0 {
		return -1
	}
	return v
}

// tieMargin maps the config's 0 ("exact ties only") to scoring's negative sentinel.
func tieMargin(v float64) float64 {
	if v == 0 {
		return -1
	}
	return v
}

func (s Scoring) validate() error {
	if !slices.Contains(scoring.PolicyNames, s.Policy) {
		return fieldErr("scoring.policy", "unknown policy %q (one of %v)", s.Policy, scoring.PolicyNames)
	}
	pos := []struct {
		key string
		v   float64
	}{
		{"scoring.prefill_tokens_per_second", s.PrefillTokensPerSecond},
		{"scoring.cpu_tier_tokens_per_second", s.CPUTierTokensPerSecond},
		{"scoring.disk_tier_tokens_per_second", s.DiskTierTokensPerSecond},
		{"scoring.batch_tokens", float64(s.BatchTokens)},
		{"scoring.foreign_request_tokens", float64(s.ForeignRequestTokens)},
		{"scoring.residual_clip", s.ResidualClip},
		{"scoring.kv_bytes_per_token", s.KVBytesPerToken},
		{"scoring.kv_transfer_bytes_per_second", s.KVTransferBytesPerSecond},
	}
	for _, p := range pos {
		if p.v <= 0 {
			return fieldErr(p.key, "must be > 0, got %g", p.v)
		}
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"scoring.overhead", s.Overhead}, {"scoring.decode_interference", s.DecodeInterference}, {"scoring.tie_margin_min", s.TieMarginMin},
		{"scoring.write_half_life", s.WriteHalfLife}, {"scoring.max_ttft", s.MaxTTFT}, {"scoring.retry_after_max", s.RetryAfterMax}, {"scoring.scrape.interval", s.Scrape.Interval},
		{"scoring.scrape.timeout", s.Scrape.Timeout}, {"scoring.factor_half_life", s.FactorHalfLife},
		{"scoring.adapter_load_time", s.AdapterLoadTime}, {"scoring.adapter_slot_wait", s.AdapterSlotWait},
		{"scoring.kv_transfer_latency", s.KVTransferLatency}} {
		if d.v < 0 {
			return fieldErr(d.key, "must be ≥ 0, got %s", d.v)
		}
	}
	if s.TieMargin < 0 || s.TieMargin > 1 {
		return fieldErr("scoring.tie_margin", "must be in [0, 1] (a fraction of the best prediction), got %g", s.TieMargin)
	}
	if s.PDMaxLocalPrefillTokens < -1 || s.PDMaxLocalPrefillTokens == 0 {
		return fieldErr("scoring.pd_max_local_prefill_tokens", "must be ≥ 1 tokens, or -1 for no cap, got %d", s.PDMaxLocalPrefillTokens)
	}
	if !(s.KVTransferLearnWeight >= 0 && s.KVTransferLearnWeight <= 1) {
		return fieldErr("scoring.kv_transfer_learn_weight", "must be in [0, 1] (0 off), got %g", s.KVTransferLearnWeight)
	}
	if s.Baselines.PDNonCachedTokens < -1 || s.Baselines.PDNonCachedTokens == 0 {
		return fieldErr("scoring.baselines.llmd_pd_non_cached_tokens", "must be ≥ 1 tokens, or -1 to always disaggregate, got %d", s.Baselines.PDNonCachedTokens)
	}
	if s.CongestionMax < 0 {
		return fieldErr("scoring.congestion_max", "must be ≥ 0 (0 = off), got %g", s.CongestionMax)
	}
	if s.ExploreFraction < 0 || s.ExploreFraction > 1 {
		return fieldErr("scoring.explore_fraction", "must be in [0, 1], got %g", s.ExploreFraction)
	}
	if s.Forgetting <= 0 || s.Forgetting > 1 {
		return fieldErr("scoring.forgetting", "must be in (0, 1], got %g", s.Forgetting)
	}
	if s.ClampFactor <= 1 {
		return fieldErr("scoring.clamp_factor", "must be > 1, got %g", s.ClampFactor)
	}
	if s.Scrape.FailuresBeforeUnhealthy < 1 {
		return fieldErr("scoring.scrape.failures_before_unhealthy", "must be ≥ 1, got %d", s.Scrape.FailuresBeforeUnhealthy)
	}
	if s.Scrape.Interval > 0 && s.Scrape.Timeout > s.Scrape.Interval {
		return fieldErr("scoring.scrape.timeout", "must be ≤ scoring.scrape.interval (%s), got %s", s.Scrape.Interval, s.Scrape.Timeout)
	}
	b := s.Baselines
	if b.SGLCacheThreshold < 0 || b.SGLCacheThreshold > 1 || b.SaturationKV < 0 || b.SaturationKV > 1 {
		return fieldErr("scoring.baselines", "ratios (sglang_cache_threshold, llmd_saturation_kv) must be in [0, 1]")
	}
	if b.DynamoOverlapWeight < 0 || b.DynamoTemperature < 0 || b.SGLBalanceAbs < 0 || b.SGLBalanceRel < 0 || b.SaturationQueue < 0 ||
		b.SaturationTokens < 0 || b.GIEBlockChars < 0 {
		return fieldErr("scoring.baselines", "values must be ≥ 0")
	}
	return nil
}
