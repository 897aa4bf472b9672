package config

import "time"

// Index configures the KV prefix index and its event subscriptions.
type Index struct {
	// SpeculativeTTL is how long blocks booked at pick time count as cached without a
	// confirming KV event. 0 disables speculative entries.
	SpeculativeTTL time.Duration `mapstructure:"speculative_ttl"`
}

func defaultIndex() Index {
	return Index{SpeculativeTTL: 30 * time.Second}
}

func (i Index) validate() error {
	if i.SpeculativeTTL < 0 {
		return fieldErr("index.speculative_ttl", "must be ≥ 0, got %s", i.SpeculativeTTL)
	}
	return nil
}
