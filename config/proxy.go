package config

import (
	"strings"
	"time"
)

// Proxy configures `kvroute proxy`'s upstream side and what it forwards.
type Proxy struct {
	// UpstreamHeaderTimeout bounds the wait for a worker's response headers after the
	// request was sent. vLLM answers a non-streamed request only when the generation
	// ends, so this is generous; a worker that accepts and never answers is cut, the
	// ticket ends as an upstream error and the worker is marked unhealthy.
	UpstreamHeaderTimeout time.Duration `mapstructure:"upstream_header_timeout"`
	// UpstreamIdleTimeout bounds the silence between two reads of a worker's response
	// body (an engine that hangs mid-stream): same outcome as the header timeout.
	UpstreamIdleTimeout time.Duration `mapstructure:"upstream_idle_timeout"`
	// MaxIdleConnsPerHost is the idle keep-alive pool per worker (net/http's default of
	// 2 leaves tens of thousands of sockets in TIME_WAIT at a few hundred req/s).
	MaxIdleConnsPerHost int `mapstructure:"max_idle_conns_per_host"`
	// Paths are the request paths forwarded to workers (exact match: a trailing "/" is
	// another path, answered 404 by kvroute as vLLM's FastAPI would redirect or 404
	// it); every other path is answered 404 by kvroute, so worker-admin routes
	// (POST /reset_prefix_cache, /start_profile, ...) are not reachable through it.
	Paths []string `mapstructure:"paths"`
	// InjectIncludeUsage adds stream_options.include_usage=true to streamed chat and
	// completions requests that name no stream_options, so that budgets settle and
	// learning calibrates on the engine's usage (cached tokens included), and removes the
	// usage-only chunk this adds from the client's stream.
	InjectIncludeUsage bool `mapstructure:"inject_include_usage"`
}

// DefaultProxyPaths are the inference API paths forwarded by default: the OpenAI
// routes every vLLM OpenAI server (vllm/entrypoints/openai/api_server.py) serves.
// Anthropic's /v1/messages is not among them: only recent vLLM versions serve it
// (vllm/entrypoints/anthropic/api_router.py; kvroute's vllm-sim does too); older ones
// answer 404 — add it to proxy.paths when every worker serves it.
var DefaultProxyPaths = []string{"/v1/chat/completions", "/v1/completions", "/v1/models"}

func defaultProxy() Proxy {
	return Proxy{UpstreamHeaderTimeout: 10 * time.Minute, UpstreamIdleTimeout: 5 * time.Minute,
		MaxIdleConnsPerHost: 256, Paths: append([]string(nil), DefaultProxyPaths...), InjectIncludeUsage: true}
}

func (p Proxy) validate() error {
	if p.UpstreamHeaderTimeout <= 0 {
		return fieldErr("proxy.upstream_header_timeout", "must be > 0, got %s", p.UpstreamHeaderTimeout)
	}
	if p.UpstreamIdleTimeout <= 0 {
		return fieldErr("proxy.upstream_idle_timeout", "must be > 0, got %s", p.UpstreamIdleTimeout)
	}
	if p.MaxIdleConnsPerHost < 1 {
		return fieldErr("proxy.max_idle_conns_per_host", "must be ≥ 1, got %d", p.MaxIdleConnsPerHost)
	}
	if len(p.Paths) == 0 {
		return fieldErr("proxy.paths", "must list at least one path (default %v)", DefaultProxyPaths)
	}
	for i, s := range p.Paths {
		if !strings.HasPrefix(s, "/") || strings.ContainsAny(s, "?# ") {
			return fieldErr("proxy.paths", "element %d %q is not a plain absolute path", i, s)
		}
	}
	return nil
}
