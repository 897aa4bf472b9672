package config

import (
	"time"

	"github.com/kvroute/kvroute/router"
)

// Router configures the router core.
type Router struct {
	TicketTTL        time.Duration `mapstructure:"ticket_ttl"`         // release in-flight bookings older than this (lost responses)
	DefaultBlockSize int           `mapstructure:"default_block_size"` // KV block size in tokens for models without one
	// MaxPromptTokens caps the prompt tokens hashed, looked up and booked per request for
	// models without models[].max_model_len (tokens).
	MaxPromptTokens int `mapstructure:"max_prompt_tokens"`
}

func defaultRouter() Router {
	return Router{TicketTTL: router.DefaultTicketTTL, DefaultBlockSize: router.DefaultBlockSize, MaxPromptTokens: router.DefaultMaxPromptTokens}
}

func (r Router) validate() error {
	if r.TicketTTL < time.Second {
		return fieldErr("router.ticket_ttl", "must be ≥ 1s, got %s", r.TicketTTL)
	}
	if r.DefaultBlockSize <= 0 || r.DefaultBlockSize > 4096 {
		return fieldErr("router.default_block_size", "must be in 1..4096 tokens, got %d", r.DefaultBlockSize)
	}
	if r.MaxPromptTokens < 16 {
		return fieldErr("router.max_prompt_tokens", "must be ≥ 16 tokens, got %d", r.MaxPromptTokens)
	}
	return nil
}
