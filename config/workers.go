package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/workers"
)

// Model describes one served model.
type Model struct {
	Name      string `mapstructure:"name"`       // served model name as clients send it
	BlockSize int    `mapstructure:"block_size"` // KV block size in tokens; 0 = router.default_block_size
	// Base names the base model when Name is a LoRA adapter ("" otherwise).
	Base string `mapstructure:"base"`
	// MaxModelLen is the model's context length in tokens (vLLM --max-model-len); 0
	// unknown. It caps the prompt tokens routing considers (else router.max_prompt_tokens).
	MaxModelLen int `mapstructure:"max_model_len"`
	// KV cache size per token (prices a prefill→decode transfer, docs/pd.md): given as
	// KVBytesPerToken, or computed from the model's shape — NumLayers, NumKVHeads,
	// HeadDim and KVDtypeBytes (0 → 2, bf16/fp16) — as 2 × layers × KV heads × head dim
	// × dtype bytes (vllm/v1/kv_cache_interface.py AttentionSpec.page_size_bytes per
	// token). All zero: scoring.kv_bytes_per_token.
	KVBytesPerToken float64 `mapstructure:"kv_bytes_per_token"`
	NumLayers       int     `mapstructure:"num_layers"`
	NumKVHeads      int     `mapstructure:"num_kv_heads"`
	HeadDim         int     `mapstructure:"head_dim"`
	KVDtypeBytes    int     `mapstructure:"kv_dtype_bytes"`

	// Tokenizer is the model's tokenizer directory: a Hugging Face layout directory
	// (tokenizer.json, tokenizer_config.json, optional chat_template.jinja) or a hub
	// cache entry (models--org--name, whose refs/main snapshot is used). "" = none:
	// the model is tokenized remotely or not at all. A LoRA adapter (Base set) without
	// its own uses its base model's.
	Tokenizer string `mapstructure:"tokenizer"`
	// TokenizePaths are the tokenization paths tried in order: "local" (in process,
	// needs Tokenizer) and "remote" (the worker's POST /tokenize). Empty = [local,
	// remote] with a Tokenizer, [remote] without. When all fail the pick is made on
	// load alone.
	TokenizePaths []string `mapstructure:"tokenize_paths"`
	// RemoteTokenizeTimeout bounds one call to a worker's /tokenize; 0 = 250ms.
	RemoteTokenizeTimeout time.Duration `mapstructure:"remote_tokenize_timeout"`
	// RemoteTokenizeBudget bounds the time one request spends on remote tokenization
	// over every worker tried; 0 = twice RemoteTokenizeTimeout.
	RemoteTokenizeBudget time.Duration `mapstructure:"remote_tokenize_budget"`
}

// Worker is one statically configured inference endpoint.
type Worker struct {
	Name     string         `mapstructure:"name"`    // "" = address
	Address  string         `mapstructure:"address"` // HTTP "ip:port" written into the destination header
	Models   []string       `mapstructure:"models"`  // served model names; empty = every configured model
	KVEvents WorkerKVEvents `mapstructure:"kv_events"`
	Profile  WorkerProfile  `mapstructure:"profile"`
	// Role is the worker's part in prefill/decode disaggregation: prefill, decode or
	// both ("" = both, an aggregated worker). See docs/pd.md.
	Role string `mapstructure:"role"`
}

// WorkerKVEvents says where the worker publishes vLLM KV events.
type WorkerKVEvents struct {
	Endpoint       string `mapstructure:"endpoint"`        // ZMQ PUB endpoint, e.g. tcp://10.0.0.5:5557
	ReplayEndpoint string `mapstructure:"replay_endpoint"` // ZMQ ROUTER replay endpoint
	Topic          string `mapstructure:"topic"`
	DPSize         int    `mapstructure:"dp_size"` // data-parallel ranks (rank r on port+r)
}

// WorkerProfile is the prior for the worker's speed.
type WorkerProfile struct {
	PrefillTokensPerSecond float64       `mapstructure:"prefill_tokens_per_second"`
	DecodeTokensPerSecond  float64       `mapstructure:"decode_tokens_per_second"`
	Overhead               time.Duration `mapstructure:"overhead"`
	BlockCapacity          int           `mapstructure:"block_capacity"`
	// MaxNumSeqs is the worker's vLLM --max-num-seqs: kvroute's queue holds a request
	// for a worker with this many booked requests (router.Saturation); 0 = 256,
	// vLLM's default on GPUs under 70 GiB and A100s (1024 on larger ones: set it).
	MaxNumSeqs int `mapstructure:"max_num_seqs"`
}

// KVBytes returns the model's KV cache size per token, bytes: KVBytesPerToken when set,
// else 2 × NumLayers × NumKVHeads × HeadDim × KVDtypeBytes (0 → 2) when the shape is
// given, else 0 (scoring.kv_bytes_per_token applies).
func (m Model) KVBytes() float64 {
	if m.KVBytesPerToken > 0 {
		return m.KVBytesPerToken
	}
	if m.NumLayers <= 0 || m.NumKVHeads <= 0 || m.HeadDim <= 0 {
		return 0
	}
	dt := m.KVDtypeBytes
	if dt <= 0 {
		dt = DefaultKVDtypeBytes
	}
	return 2 * float64(m.NumLayers) * float64(m.NumKVHeads) * float64(m.HeadDim) * float64(dt)
}

func validateModels(ms []Model) error {
	seen := map[string]bool{}
	for i, m := range ms {
		key := fmt.Sprintf("models[%d]", i)
		if m.Name == "" {
			return fieldErr(key+".name", "is required")
		}
		if seen[m.Name] {
			return fieldErr(key+".name", "duplicate model %q", m.Name)
		}
		seen[m.Name] = true
		if m.BlockSize < 0 || m.BlockSize > 4096 {
			return fieldErr(key+".block_size", "must be in 0..4096 tokens, got %d", m.BlockSize)
		}
		if m.MaxModelLen < 0 {
			return fieldErr(key+".max_model_len", "must be ≥ 0 tokens, got %d", m.MaxModelLen)
		}
		if m.KVBytesPerToken < 0 || m.NumLayers < 0 || m.NumKVHeads < 0 || m.HeadDim < 0 || m.KVDtypeBytes < 0 {
			return fieldErr(key, "kv_bytes_per_token, num_layers, num_kv_heads, head_dim and kv_dtype_bytes must be ≥ 0")
		}
		if shape := m.NumLayers + m.NumKVHeads + m.HeadDim; shape > 0 && (m.NumLayers == 0 || m.NumKVHeads == 0 || m.HeadDim == 0) {
			return fieldErr(key, "num_layers, num_kv_heads and head_dim are given together (the KV bytes per token are computed from all three)")
		}
		if err := validateTokenizePaths(key, m); err != nil {
			return err
		}
	}
	for i, m := range ms {
		if m.Base != "" && !seen[m.Base] {
			return fieldErr(fmt.Sprintf("models[%d].base", i), "base model %q is not in models", m.Base)
		}
	}
	return nil
}

// validateHostPort accepts a literal "IP:port" (Envoy's ORIGINAL_DST needs an address,
// not a hostname) or "host:port" when allowHost.
func validateHostPort(key, v string, allowHost bool) error {
	h, p, err := net.SplitHostPort(v)
	if err != nil {
		return fieldErr(key, "%q is not host:port", v)
	}
	if n, err := strconv.Atoi(p); err != nil || n <= 0 || n > 65535 {
		return fieldErr(key, "%q has an invalid port", v)
	}
	if !allowHost && net.ParseIP(h) == nil {
		return fieldErr(key, "%q must be a literal IP:port (Envoy's ORIGINAL_DST cluster cannot resolve hostnames)", v)
	}
	return nil
}

func validateWorkers(ws []Worker, ms []Model, d Discovery) error {
	known := map[string]bool{}
	for _, m := range ms {
		known[m.Name] = true
	}
	names := map[string]bool{}
	for i, w := range ws {
		key := fmt.Sprintf("workers[%d]", i)
		if err := validateHostPort(key+".address", w.Address, false); err != nil {
			return err
		}
		name := w.Name
		if name == "" {
			name = w.Address
		}
		if names[name] {
			return fieldErr(key+".name", "duplicate worker %q", name)
		}
		names[name] = true
		for j, m := range w.Models {
			if len(ms) > 0 && !known[m] {
				return fieldErr(fmt.Sprintf("%s.models[%d]", key, j), "model %q is not in models", m)
			}
		}
		if e := w.KVEvents.Endpoint; e != "" && !strings.HasPrefix(e, "tcp://") && !strings.HasPrefix(e, "ipc://") {
			return fieldErr(key+".kv_events.endpoint", "%q must be a ZMQ endpoint (tcp://host:port or ipc://path)", e)
		}
		if w.KVEvents.DPSize < 0 {
			return fieldErr(key+".kv_events.dp_size", "must be ≥ 0, got %d", w.KVEvents.DPSize)
		}
		if w.Profile.PrefillTokensPerSecond < 0 || w.Profile.DecodeTokensPerSecond < 0 {
			return fieldErr(key+".profile", "token rates must be ≥ 0")
		}
		if _, err := workers.ParseRole(w.Role); err != nil {
			return fieldErr(key+".role", "%v", err)
		}
		if w.Profile.MaxNumSeqs < 0 {
			return fieldErr(key+".profile.max_num_seqs", "must be ≥ 0 requests, got %d", w.Profile.MaxNumSeqs)
		}
	}
	return nil
}
