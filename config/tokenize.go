package config

import "fmt"

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
	return nil
}
