package config

import (
	"slices"
	"time"

	"github.com/kvroute/kvroute/scoring"
)

// Scoring configures the TTFT predictor and the picker.
type Scoring struct {
	// Policy selects the picker: "kvroute" (predicted TTFT) or a baseline.
	Policy string `mapstructure:"policy"`
	// PrefillTokensPerSecond is the default prefill rate for workers without a profile.
	PrefillTokensPerSecond float64 `mapstructure:"prefill_tokens_per_second"`
	// Overhead is the default fixed per-request time for workers without a profile.
	Overhead time.Duration `mapstructure:"overhead"`
}

func defaultScoring() Scoring {
	return Scoring{Policy: "kvroute", PrefillTokensPerSecond: 5000, Overhead: 20 * time.Millisecond}
}

func (s Scoring) validate() error {
	if !slices.Contains(scoring.PolicyNames, s.Policy) {
		return fieldErr("scoring.policy", "unknown policy %q (one of %v)", s.Policy, scoring.PolicyNames)
	}
	if s.PrefillTokensPerSecond <= 0 {
		return fieldErr("scoring.prefill_tokens_per_second", "must be > 0, got %g", s.PrefillTokensPerSecond)
	}
	if s.Overhead < 0 {
		return fieldErr("scoring.overhead", "must be ≥ 0, got %s", s.Overhead)
	}
	return nil
}
