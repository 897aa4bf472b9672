package config

import (
	"cmp"
	"slices"

	"github.com/kvroute/kvroute/kvindex/zmqsub"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/workers"
)

// DefaultKVDtypeBytes is models[].kv_dtype_bytes when 0: bf16/fp16 KV cache.
const DefaultKVDtypeBytes = 2

// Effective returns c with every key whose zero value selects a default replaced by
// the value the server uses (`kvroute config` prints it): each default comes from the
// package that applies it (tokenize, zmqsub, workers, router, scoring), so it is written
// once. Zeros that mean "off", "none" or "unlimited" stay zero. c is not modified (its
// lists are copied).
//
// Filled: models[] block_size (router.default_block_size), kv_dtype_bytes,
// kv_bytes_per_token (from the shape, else scoring.kv_bytes_per_token),
// tokenize_paths, remote_tokenize_timeout, remote_tokenize_budget; workers[] name
// (address) and models (every configured model); workers[].profile and
// discovery.profile prefill_tokens_per_second, overhead (scoring's priors) and
// max_num_seqs; discovery.models; admission.classes[] on_slo_miss and slo_attainment;
// the redis_down of admission.default, tenants (admission.redis.down); tokenize's cache
// bounds and shadow check; index.replay_buffer_*; scoring.scrape.timeout.
func (c Config) Effective() Config {
	var all []string
	for _, m := range c.Models {
		all = append(all, m.Name)
	}
	c.Models = slices.Clone(c.Models)
	for i := range c.Models {
		m := &c.Models[i]
		if m.BlockSize == 0 {
			m.BlockSize = c.Router.DefaultBlockSize
		}
		if m.KVBytesPerToken = m.KVBytes(); m.KVBytesPerToken == 0 {
			m.KVBytesPerToken = c.Scoring.KVBytesPerToken
		}
		if m.KVDtypeBytes == 0 {
			m.KVDtypeBytes = DefaultKVDtypeBytes
		}
		tc := tokenize.ModelConfig{Tokenizer: m.Tokenizer, Base: m.Base, RemoteTimeout: m.RemoteTokenizeTimeout,
			RemoteBudget: m.RemoteTokenizeBudget}
		for _, p := range m.TokenizePaths {
			tc.Paths = append(tc.Paths, tokenize.Path(p))
		}
		tc = tc.WithDefaults()
		m.TokenizePaths = nil
		for _, p := range tc.Paths {
			m.TokenizePaths = append(m.TokenizePaths, string(p))
		}
		m.RemoteTokenizeTimeout, m.RemoteTokenizeBudget = tc.RemoteTimeout, tc.RemoteBudget
	}

	c.Workers = slices.Clone(c.Workers)
	for i := range c.Workers {
		w := &c.Workers[i]
		if w.Name == "" {
			w.Name = w.Address
		}
		if len(w.Models) == 0 {
			w.Models = all
		}
		w.Profile = c.Scoring.effectiveProfile(w.Profile)
	}
	if len(c.Discovery.Models) == 0 {
		c.Discovery.Models = all
	}
	c.Discovery.Profile = c.Scoring.effectiveProfile(c.Discovery.Profile)

	a := &c.Admission
	a.Classes = slices.Clone(a.Classes)
	for i := range a.Classes {
		cl := &a.Classes[i]
		if cl.OnSLOMiss == "" {
			cl.OnSLOMiss = SLOMissAdmit
		}
		if cl.SLOAttainment == 0 {
			cl.SLOAttainment = router.DefaultSLOAttainment
		}
	}
	if a.Default.RedisDown == "" {
		a.Default.RedisDown = a.Redis.Down
	}
	a.Tenants = slices.Clone(a.Tenants)
	for i := range a.Tenants {
		if a.Tenants[i].RedisDown == "" {
			a.Tenants[i].RedisDown = a.Redis.Down
		}
	}

	t := &c.Tokenize
	to := tokenize.Options{CacheBytes: t.CacheBytes, MinCachedSegment: t.MinCachedSegment,
		RenderCacheBytes: t.RenderCacheBytes}.WithDefaults()
	t.CacheBytes, t.MinCachedSegment, t.RenderCacheBytes = to.CacheBytes, to.MinCachedSegment, to.RenderCacheBytes
	sh := tokenize.ShadowOptions{Fraction: t.Shadow.Fraction, MaxPerSecond: t.Shadow.MaxPerSecond,
		MismatchRate: t.Shadow.MismatchRate, MinChecks: t.Shadow.MinChecks, Timeout: t.Shadow.Timeout}.WithDefaults()
	t.Shadow = TokenizeShadow{Fraction: sh.Fraction, MaxPerSecond: sh.MaxPerSecond, MismatchRate: sh.MismatchRate,
		MinChecks: sh.MinChecks, Timeout: sh.Timeout}

	zo := zmqsub.Options{QueueSize: c.Index.QueueSize, MaxMessageBytes: c.Index.MaxMessageBytes,
		ReplayBufferFrames: c.Index.ReplayBufferFrames, ReplayBufferBytes: c.Index.ReplayBufferBytes}.WithDefaults()
	c.Index.ReplayBufferFrames, c.Index.ReplayBufferBytes = zo.ReplayBufferFrames, zo.ReplayBufferBytes

	if sc := &c.Scoring.Scrape; sc.Interval > 0 && sc.Timeout <= 0 { // interval 0: no scraping
		sc.Timeout = workers.DefaultScrapeTimeout(sc.Interval)
	}
	return c
}

// effectiveProfile fills a worker profile's zero prefill rate and overhead with the
// scoring priors the predictor uses for it (scoring.prefill_tokens_per_second,
// scoring.overhead, themselves defaulted by scoring) and max_num_seqs with vLLM's
// default (router.DefaultMaxNumSeqs).
func (s Scoring) effectiveProfile(p WorkerProfile) WorkerProfile {
	def := scoring.DefaultOptions()
	if p.PrefillTokensPerSecond == 0 {
		p.PrefillTokensPerSecond = cmp.Or(s.PrefillTokensPerSecond, def.PrefillTokensPerSecond)
	}
	if p.Overhead == 0 {
		p.Overhead = cmp.Or(s.Overhead, def.Overhead)
	}
	if p.MaxNumSeqs == 0 {
		p.MaxNumSeqs = router.DefaultMaxNumSeqs
	}
	return p
}
