package config

import (
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/scoring"
)

func TestScoringDefaultsValidateAndConvert(t *testing.T) {
	s := defaultScoring()
	if err := s.validate(); err != nil {
		t.Fatalf("defaults must validate: %v", err)
	}
	o := s.Options()
	if o.PrefillTokensPerSecond != 5000 || o.TieMargin != 0.1 || o.WriteHalfLife != 30*time.Second || o.Forgetting != 0.99 || o.Baselines.SGLBalanceRel != 1.5 {
		t.Fatalf("options not carried over: %+v", o)
	}
	for _, name := range scoring.PolicyNames {
		s.Policy = name
		if _, err := scoring.New(name, s.Options()); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	s = defaultScoring()
	s.TieMargin, s.Baselines.DynamoOverlapWeight = 0, 0
	if o := s.Options(); o.TieMargin >= 0 || o.Baselines.DynamoOverlap >= 0 {
		t.Fatalf("config 0 must map to scoring's 'off' sentinels (negative): %+v", o)
	}
}

func TestScoringValidationNamesTheKey(t *testing.T) {
	for key, mut := range map[string]func(*Scoring){
		"scoring.policy":                           func(s *Scoring) { s.Policy = "best" },
		"scoring.prefill_tokens_per_second":        func(s *Scoring) { s.PrefillTokensPerSecond = 0 },
		"scoring.forgetting":                       func(s *Scoring) { s.Forgetting = 1.5 },
		"scoring.clamp_factor":                     func(s *Scoring) { s.ClampFactor = 1 },
		"scoring.tie_margin":                       func(s *Scoring) { s.TieMargin = -0.1 },
		"scoring.max_ttft":                         func(s *Scoring) { s.MaxTTFT = -time.Second },
		"scoring.adapter_load_time":                func(s *Scoring) { s.AdapterLoadTime = -time.Second },
		"scoring.adapter_slot_wait":                func(s *Scoring) { s.AdapterSlotWait = -time.Second },
		"scoring.scrape.failures_before_unhealthy": func(s *Scoring) { s.Scrape.FailuresBeforeUnhealthy = 0 },
		"scoring.scrape.timeout":                   func(s *Scoring) { s.Scrape.Timeout = 2 * time.Second },
		"scoring.baselines":                        func(s *Scoring) { s.Baselines.SGLCacheThreshold = 2 },
	} {
		s := defaultScoring()
		mut(&s)
		err := s.validate()
		if err == nil || !strings.HasPrefix(err.Error(), key+":") {
			t.Errorf("%s: error %v must name the key", key, err)
		}
	}
}

// The overload and learning-floor settings reach scoring.Options; 0 in the config means
// off (scoring's negative sentinel), never scoring's own default.
func TestScoringOverloadAndLearningKeys(t *testing.T) {
	o := defaultScoring().Options()
	if o.CongestionMax != 8 || o.FactorHalfLife != time.Minute || o.ExploreFraction != 0.01 || o.QueueBacklog || o.CacheTurnover {
		t.Fatalf("defaults: %+v", o)
	}
	s := defaultScoring()
	s.CongestionMax, s.FactorHalfLife, s.ExploreFraction, s.QueueBacklog, s.CacheTurnover = 0, 0, 0, true, true
	if o := s.Options(); o.CongestionMax >= 0 || o.FactorHalfLife >= 0 || o.ExploreFraction >= 0 || !o.QueueBacklog || !o.CacheTurnover {
		t.Fatalf("0 must turn the feature off: %+v", o)
	}
	s = defaultScoring()
	s.ExploreFraction = 2
	if err := s.validate(); err == nil {
		t.Fatal("explore_fraction 2 must be refused")
	}
}

func TestAdapterOptionsReachScoring(t *testing.T) {
	s := defaultScoring()
	if o := s.Options(); o.AdapterLoadTime != 200*time.Millisecond || o.AdapterSlotWait != 2*time.Second {
		t.Fatalf("defaults: load %v slot wait %v, want 200ms and 2s", o.AdapterLoadTime, o.AdapterSlotWait)
	}
	s.AdapterLoadTime, s.AdapterSlotWait = time.Second, 3*time.Second
	if o := s.Options(); o.AdapterLoadTime != time.Second || o.AdapterSlotWait != 3*time.Second {
		t.Fatalf("configured values lost: %v %v", o.AdapterLoadTime, o.AdapterSlotWait)
	}
}
