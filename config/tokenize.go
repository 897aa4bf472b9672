package config

import (
	"fmt"
	"time"
)

// Tokenize holds settings shared by every model's in-process tokenizer (per-model
// settings are models[].tokenizer, models[].tokenize_paths and
// models[].remote_tokenize_timeout). Every value is valid: 0 selects the default.
type Tokenize struct {
	// CacheBytes bounds each model's segment cache (token ids of text runs between
	// special tokens, reused by the next turn of a conversation): 0 = 64 MiB,
	// negative = no cache.
	CacheBytes int64 `mapstructure:"cache_bytes"`
	// MinCachedSegment is the shortest text run, in bytes, worth caching; ≤ 0 = 256.
	MinCachedSegment int `mapstructure:"min_cached_segment"`
	// RenderCacheBytes bounds each model's render cache (conversation prefixes
	// rendered by the chat template and tokenized, extended by the next turn):
	// 0 = 128 MiB, negative = every chat rendered in full.
	RenderCacheBytes int64 `mapstructure:"render_cache_bytes"`
	// Shadow is the shadow check of local ids against the picked worker's /tokenize.
	Shadow TokenizeShadow `mapstructure:"shadow"`
	// HarmonyTimeZone is the IANA time zone of the engine hosts, whose local date
	// vLLM writes into every gpt-oss (harmony) chat prompt; "" = UTC.
	HarmonyTimeZone string `mapstructure:"harmony_time_zone"`
	// HarmonyStartDate pins that date (YYYY-MM-DD) as vLLM's VLLM_SYSTEM_START_DATE
	// does; "" = the current date in HarmonyTimeZone.
	HarmonyStartDate string `mapstructure:"harmony_start_date"`
}

// TokenizeShadow configures the shadow check (tokenize.ShadowOptions): 0 selects each
// default.
type TokenizeShadow struct {
	// Fraction of local-path requests checked, in [0, 1]; 0 = 0.01, negative = off.
	Fraction float64 `mapstructure:"fraction"`
	// MaxPerSecond caps checks per model; 0 = 1.
	MaxPerSecond float64 `mapstructure:"max_per_second"`
	// MismatchRate above which a model is switched off its local path (to its remote
	// path, or to load-only picks when it has none), in [0, 1]; 0 = 0.05.
	MismatchRate float64 `mapstructure:"mismatch_rate"`
	// MinChecks before the rate is judged; 0 = 20.
	MinChecks int `mapstructure:"min_checks"`
	// Timeout of one check's call to the worker; 0 = 2s.
	Timeout time.Duration `mapstructure:"timeout"`
}

// validateTokenize checks the tokenize section.
func validateTokenize(t Tokenize) error {
	sh := t.Shadow
	switch {
	case sh.Fraction > 1:
		return fieldErr("tokenize.shadow.fraction", "must be ≤ 1 (negative = off), got %v", sh.Fraction)
	case sh.MaxPerSecond < 0:
		return fieldErr("tokenize.shadow.max_per_second", "must be ≥ 0, got %v", sh.MaxPerSecond)
	case sh.MismatchRate < 0 || sh.MismatchRate > 1:
		return fieldErr("tokenize.shadow.mismatch_rate", "must be in [0, 1], got %v", sh.MismatchRate)
	case sh.MinChecks < 0:
		return fieldErr("tokenize.shadow.min_checks", "must be ≥ 0, got %d", sh.MinChecks)
	case sh.Timeout < 0:
		return fieldErr("tokenize.shadow.timeout", "must be ≥ 0, got %s", sh.Timeout)
	}
	if t.HarmonyTimeZone != "" {
		if _, err := time.LoadLocation(t.HarmonyTimeZone); err != nil {
			return fieldErr("tokenize.harmony_time_zone", "unknown time zone %q: %v", t.HarmonyTimeZone, err)
		}
	}
	if t.HarmonyStartDate != "" {
		if _, err := time.Parse("2006-01-02", t.HarmonyStartDate); err != nil {
			return fieldErr("tokenize.harmony_start_date", "must be YYYY-MM-DD, got %q", t.HarmonyStartDate)
		}
	}
	return nil
}

// validateTokenizePaths checks models[i].tokenize_paths and remote_tokenize_timeout.
func validateTokenizePaths(key string, m Model) error {
	seen := map[string]bool{}
	for j, p := range m.TokenizePaths {
		k := fmt.Sprintf("%s.tokenize_paths[%d]", key, j)
		switch p {
		case "local":
			if m.Tokenizer == "" && m.Base == "" {
				return fieldErr(k, `"local" needs %s.tokenizer (a tokenizer directory)`, key)
			}
		case "remote":
		default:
			return fieldErr(k, `must be "local" or "remote", got %q`, p)
		}
		if seen[p] {
			return fieldErr(k, "path %q listed twice", p)
		}
		seen[p] = true
	}
	if m.RemoteTokenizeTimeout < 0 {
		return fieldErr(key+".remote_tokenize_timeout", "must be ≥ 0, got %s", m.RemoteTokenizeTimeout)
	}
	if m.RemoteTokenizeBudget < 0 {
		return fieldErr(key+".remote_tokenize_budget", "must be ≥ 0, got %s", m.RemoteTokenizeBudget)
	}
	return nil
}
