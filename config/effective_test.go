package config

import (
	"reflect"
	"slices"
	"testing"
	"time"
)

// Effective fills each key whose zero selects a default with the value the server uses,
// keeps what was set and the zeros that mean off, and leaves its receiver alone.
func TestEffective(t *testing.T) {
	p := writeFile(t, `
router: {default_block_size: 32}
scoring:
  prefill_tokens_per_second: 8000
  scrape: {interval: 10s}
index: {queue_size: 100}
tokenize:
  render_cache_bytes: -1
  shadow: {fraction: -1, min_checks: 5}
models:
  - {name: base, num_layers: 36, num_kv_heads: 8, head_dim: 128, remote_tokenize_timeout: 300ms}
  - {name: lora, base: base, block_size: 16, kv_dtype_bytes: 1}
workers:
  - address: 127.0.0.1:8001
  - {name: w2, address: 127.0.0.1:8002, models: [base], profile: {max_num_seqs: 512, overhead: 5ms}}
admission:
  redis: {down: fail_open}
  tenants: [{name: acme, tokens_per_minute: 10, redis_down: fail_closed}, {name: beta}]
  classes:
    - {name: chat, ttft_objective: 1s, on_slo_miss: refuse}
    - {name: batch, slo_attainment: 0.95}
`)
	fs := Flags("test")
	if err := fs.Parse([]string{"--config", p}); err != nil {
		t.Fatal(err)
	}
	c, err := Load(fs, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	before := Values(c)
	e := c.Effective()
	if !reflect.DeepEqual(Values(c), before) {
		t.Fatal("Effective modified its receiver")
	}

	base, lora := e.Models[0], e.Models[1]
	if base.BlockSize != 32 || base.KVDtypeBytes != 2 || base.KVBytesPerToken != 2*36*8*128*2 ||
		!slices.Equal(base.TokenizePaths, []string{"remote"}) ||
		base.RemoteTokenizeTimeout != 300*time.Millisecond || base.RemoteTokenizeBudget != 600*time.Millisecond {
		t.Errorf("model base: %+v", base)
	}
	// An adapter shares its base model's tokenizer: local first. Without a shape its KV
	// bytes per token are scoring.kv_bytes_per_token.
	if lora.BlockSize != 16 || lora.KVDtypeBytes != 1 || lora.KVBytesPerToken != c.Scoring.KVBytesPerToken ||
		!slices.Equal(lora.TokenizePaths, []string{"local", "remote"}) || lora.RemoteTokenizeTimeout != 250*time.Millisecond {
		t.Errorf("model lora: %+v", lora)
	}

	w1, w2 := e.Workers[0], e.Workers[1]
	if w1.Name != "127.0.0.1:8001" || !slices.Equal(w1.Models, []string{"base", "lora"}) ||
		w1.Profile.PrefillTokensPerSecond != 8000 || w1.Profile.Overhead != c.Scoring.Overhead || w1.Profile.MaxNumSeqs != 256 {
		t.Errorf("worker 1: %+v", w1)
	}
	if w2.Name != "w2" || !slices.Equal(w2.Models, []string{"base"}) || w2.Profile.MaxNumSeqs != 512 ||
		w2.Profile.Overhead != 5*time.Millisecond || w2.Profile.BlockCapacity != 0 {
		t.Errorf("worker 2: %+v", w2)
	}
	if c.Workers[0].Name != "" || len(c.Workers[0].Models) != 0 {
		t.Errorf("the configured worker changed: %+v", c.Workers[0])
	}

	cls := e.Admission.Classes
	if cls[0].OnSLOMiss != SLOMissRefuse || cls[0].SLOAttainment != 0.9 || cls[1].OnSLOMiss != SLOMissAdmit || cls[1].SLOAttainment != 0.95 {
		t.Errorf("classes: %+v", cls)
	}
	if e.Admission.Default.RedisDown != "fail_open" || e.Admission.Tenants[0].RedisDown != "fail_closed" ||
		e.Admission.Tenants[1].RedisDown != "fail_open" {
		t.Errorf("redis_down: default %q, tenants %+v", e.Admission.Default.RedisDown, e.Admission.Tenants)
	}

	tk := e.Tokenize
	if tk.CacheBytes != 64<<20 || tk.MinCachedSegment != 256 || tk.RenderCacheBytes != -1 ||
		tk.Shadow.Fraction != -1 || tk.Shadow.MinChecks != 5 || tk.Shadow.MaxPerSecond != 1 ||
		tk.Shadow.MismatchRate != 0.05 || tk.Shadow.Timeout != 2*time.Second {
		t.Errorf("tokenize: %+v", tk)
	}
	if e.Index.ReplayBufferFrames != 100 || e.Index.ReplayBufferBytes != 2*c.Index.MaxMessageBytes {
		t.Errorf("index replay buffer: %d frames, %d bytes", e.Index.ReplayBufferFrames, e.Index.ReplayBufferBytes)
	}
	if e.Scoring.Scrape.Timeout != 5*time.Second {
		t.Errorf("scrape timeout %s, want min(10s, 5s)", e.Scoring.Scrape.Timeout)
	}
	// Zeros that mean off stay zero.
	if e.Scoring.MaxTTFT != 0 || e.Admission.Default.TokensPerMinute != 0 || e.ExtProc.FallbackEndpoints != 0 {
		t.Errorf("an off switch was filled: max_ttft %s, default tpm %d, fallback %d", e.Scoring.MaxTTFT,
			e.Admission.Default.TokensPerMinute, e.ExtProc.FallbackEndpoints)
	}
}

// Without scraping (interval 0) there is no scrape timeout to show.
func TestEffectiveNoScrape(t *testing.T) {
	c := Default()
	c.Scoring.Scrape.Interval = 0
	if e := c.Effective(); e.Scoring.Scrape.Timeout != 0 {
		t.Fatalf("scrape timeout %s with scraping off", e.Scoring.Scrape.Timeout)
	}
}
