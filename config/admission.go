package config

import (
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Admission configures the admission stage (package admission): who is asking
// (identity), how many tokens and requests they may use (budgets), settled on
// completion. It runs the same in `serve` (ext_proc) and `proxy`.
type Admission struct {
	// Identity lists the tenant identity sources in order; the first that yields a
	// tenant wins. Values: "metadata" (a verified JWT claim from Envoy's jwt_authn
	// payload_in_metadata, forwarded to ext_proc in metadata_context), "header"
	// (TenantHeader set by a trusted edge: in ext_proc trusted because the Envoy
	// configuration removes the client's copy first; in proxy only from TrustedPeers),
	// "api_key" (Authorization: Bearer / x-api-key looked up in APIKeysFile). Empty:
	// every request is "unattributed".
	Identity []string `mapstructure:"identity"`
	// MetadataNamespace is the dynamic metadata namespace holding the verified JWT
	// payload (Envoy's jwt_authn filter name); MetadataKey is its payload_in_metadata
	// key; Claim is the claim naming the tenant (sub, org, ...).
	MetadataNamespace string `mapstructure:"metadata_namespace"`
	MetadataKey       string `mapstructure:"metadata_key"`
	Claim             string `mapstructure:"claim"`
	// TenantHeader is the request header a trusted edge sets to the tenant name.
	TenantHeader string `mapstructure:"tenant_header"`
	// TrustedPeers are the CIDRs (or single addresses) whose TenantHeader `kvroute
	// proxy` believes; from any other peer the header is ignored and counted
	// (kvroute_admission_untrusted_identity_total).
	TrustedPeers []string `mapstructure:"trusted_peers"`
	// APIKeysFile is a text file of "<sha256 hex of the key> <tenant>" lines (# starts a
	// comment). Keys themselves are never stored, logged or exported.
	APIKeysFile string `mapstructure:"api_keys_file"`
	// AuthThrottle limits failed API-key attempts per client address.
	AuthThrottle AuthThrottle `mapstructure:"auth_throttle"`
	// RequireTenant answers 401 to a request no identity source attributes.
	RequireTenant bool `mapstructure:"require_tenant"`
	// Backend holds budget state: "local" (in memory, one replica) or "redis" (shared by
	// every replica configured with the same Redis and key prefix; see Redis).
	Backend string `mapstructure:"backend"`
	// Redis configures the redis backend (admission.backend: redis).
	Redis RedisBudget `mapstructure:"redis"`
	// OutputHistory bounds the learned output estimate (per tenant × model p90).
	OutputHistory OutputHistory `mapstructure:"output_history"`
	// Weights price tokens: cost = uncached·prompt tokens not cached + cached·cached
	// prompt tokens + output·generated tokens. Price cached tokens lower (e.g. 0.1) to
	// reward prompts that reuse the KV cache.
	Weights CostWeights `mapstructure:"weights"`
	// DefaultOutputTokens is the output estimate of a tenant × model with no output
	// history yet (OutputHistory): a request without max_tokens reserves prompt cost +
	// w_output·estimate, where estimate is the learned p90 output of the tenant ×
	// model, or this default before it has history; tokens.
	DefaultOutputTokens int `mapstructure:"default_output_tokens"`
	// MaxOutputReservation caps the output a request with max_tokens (OpenAI
	// max_completion_tokens / max_tokens, Anthropic max_tokens) reserves: prompt cost +
	// w_output·min(max_tokens, this). Reserving what the request may generate, not an
	// estimate, keeps concurrent requests from pushing a window past its limit by more
	// than one request's overrun; settlement gives back what was not generated. Tokens.
	MaxOutputReservation int `mapstructure:"max_output_reservation"`
	// Default are the limits of every tenant not listed in Tenants ("unattributed"
	// included). 0 = unlimited.
	Default Limits `mapstructure:"default"`
	// Tenants are per-tenant limits.
	Tenants []TenantLimits `mapstructure:"tenants"`
	// MetricsTenants always get their own tenant label value; MetricsMaxTenants more
	// (the first seen) do too; every other tenant is labelled "other".
	MetricsTenants    []string `mapstructure:"metrics_tenants"`
	MetricsMaxTenants int      `mapstructure:"metrics_max_tenants"`
	// Classes are the QoS classes (config/qos.go, docs/tenants.md "Tenants, budgets and
	// classes"), first match wins; none: every request is in class "default" and
	// nothing waits in kvroute.
	Classes []Class `mapstructure:"classes"`
	// QueueMax bounds the requests waiting in kvroute's queue, all classes together;
	// when full an arrival sheds the lowest-priority, latest waiter below its own
	// priority, else is refused (429, x-kvroute-rejected-reason: queue_full).
	QueueMax int `mapstructure:"queue_max"`
}

// CostWeights are the token prices of admission.weights (dimensionless multipliers).
type CostWeights struct {
	Uncached float64 `mapstructure:"uncached"`
	Cached   float64 `mapstructure:"cached"`
	Output   float64 `mapstructure:"output"`
}

// Limits are one tenant's budgets; 0 means unlimited.
type Limits struct {
	// TokensPerMinute bounds the token cost (CostWeights) per fixed one-minute window.
	TokensPerMinute int64 `mapstructure:"tokens_per_minute" json:"tokens_per_minute"`
	// RequestsPerMinute bounds admitted requests per fixed one-minute window.
	RequestsPerMinute int64 `mapstructure:"requests_per_minute" json:"requests_per_minute"`
	// MaxConcurrent bounds requests admitted and not yet settled.
	MaxConcurrent int64 `mapstructure:"max_concurrent" json:"max_concurrent"`
	// TokenWindows are more token limits over other fixed windows (e.g. {window: 24h,
	// tokens: 5000000}), all checked with TokensPerMinute in one step.
	TokenWindows []TokenWindow `mapstructure:"token_windows" json:"token_windows,omitempty"`
	// RedisDown is what the redis backend does for this tenant while Redis is
	// unreachable: fail_open, fail_closed or local ("" = admission.redis.down).
	RedisDown string `mapstructure:"redis_down" json:"redis_down,omitempty"`
}

// AuthThrottle is admission.auth_throttle: a client address (IPv6: its /64) that
// presented Failures unknown API keys within Window gets 429 for its next API-key
// requests, before the key is looked at, until its bucket refills (Failures per
// Window). MaxClients bounds the addresses tracked (least recently failed evicted).
// Failures 0: off.
type AuthThrottle struct {
	Failures   int           `mapstructure:"failures"`
	Window     time.Duration `mapstructure:"window"`
	MaxClients int           `mapstructure:"max_clients"`
}

// TenantLimits are Limits for one named tenant.
type TenantLimits struct {
	Name   string `mapstructure:"name"`
	Limits `mapstructure:",squash"`
	// Models are token limits of this tenant for one model each, checked in addition
	// to the tenant's own.
	Models []ModelLimits `mapstructure:"models"`
}

// IdentitySources are the accepted values of admission.identity.
var IdentitySources = []string{"metadata", "header", "api_key"}

// DefaultMetricsMaxTenants is admission.metrics_max_tenants' default: how many tenants
// (beyond metrics_tenants) get their own label value. docs/metrics.md states it; a test
// checks the two agree.
const DefaultMetricsMaxTenants = 100

func defaultAdmission() Admission {
	return Admission{MetadataNamespace: "envoy.filters.http.jwt_authn", MetadataKey: "jwt_payload", Claim: "sub",
		TenantHeader: "x-kvroute-tenant", Backend: "local", Weights: CostWeights{Uncached: 1, Cached: 1, Output: 1},
		DefaultOutputTokens: 1024, MaxOutputReservation: 32768, MetricsMaxTenants: DefaultMetricsMaxTenants, QueueMax: 10000,
		AuthThrottle: AuthThrottle{Failures: 10, Window: time.Minute, MaxClients: 65536},
		Redis:        defaultRedisBudget(), OutputHistory: OutputHistory{Samples: 64, MinSamples: 8, MaxKeys: 4096}}
}

// ParsePeers parses admission.trusted_peers: CIDRs or single addresses.
func ParsePeers(ss []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for i, s := range ss {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fieldErr("admission.trusted_peers", "element %d %q is neither a CIDR nor an address", i, s)
		}
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

func (a Admission) validate() error {
	for i, s := range a.Identity {
		if !slices.Contains(IdentitySources, s) {
			return fieldErr("admission.identity", "element %d %q is not one of %s", i, s, strings.Join(IdentitySources, ", "))
		}
		if slices.Index(a.Identity, s) != i {
			return fieldErr("admission.identity", "%q is listed twice", s)
		}
	}
	if slices.Contains(a.Identity, "metadata") && (a.MetadataNamespace == "" || a.MetadataKey == "" || a.Claim == "") {
		return fieldErr("admission.claim", "identity source metadata needs metadata_namespace, metadata_key and claim")
	}
	if slices.Contains(a.Identity, "header") && a.TenantHeader == "" {
		return fieldErr("admission.tenant_header", "identity source header needs a header name")
	}
	if a.TenantHeader != strings.ToLower(a.TenantHeader) {
		return fieldErr("admission.tenant_header", "must be lower case (HTTP/2 header names), got %q", a.TenantHeader)
	}
	if slices.Contains(a.Identity, "api_key") && a.APIKeysFile == "" {
		return fieldErr("admission.api_keys_file", "identity source api_key needs a key file")
	}
	if t := a.AuthThrottle; t.Failures < 0 || (t.Failures > 0 && (t.Window <= 0 || t.MaxClients < 1)) {
		return fieldErr("admission.auth_throttle", "failures must be ≥ 0 (0 = off); with failures, window > 0 and max_clients ≥ 1, got %+v", t)
	}
	if _, err := ParsePeers(a.TrustedPeers); err != nil {
		return err
	}
	if err := a.validateBudget(); err != nil {
		return err
	}
	w := a.Weights
	if w.Uncached < 0 || w.Cached < 0 || w.Output < 0 {
		return fieldErr("admission.weights", "must be ≥ 0, got %+v", w)
	}
	if a.DefaultOutputTokens < 1 {
		return fieldErr("admission.default_output_tokens", "must be ≥ 1, got %d", a.DefaultOutputTokens)
	}
	if a.MaxOutputReservation < 1 {
		return fieldErr("admission.max_output_reservation", "must be ≥ 1 token, got %d", a.MaxOutputReservation)
	}
	if a.MetricsMaxTenants < 0 {
		return fieldErr("admission.metrics_max_tenants", "must be ≥ 0, got %d", a.MetricsMaxTenants)
	}
	if err := a.validateClasses(); err != nil {
		return err
	}
	lims := append([]Limits{a.Default}, make([]Limits, 0, len(a.Tenants))...)
	seen := map[string]bool{}
	for i, t := range a.Tenants {
		if t.Name == "" || seen[t.Name] {
			return fieldErr("admission.tenants", "element %d: name %q is empty or listed twice", i, t.Name)
		}
		seen[t.Name] = true
		lims = append(lims, t.Limits)
	}
	for _, l := range lims {
		if l.TokensPerMinute < 0 || l.RequestsPerMinute < 0 || l.MaxConcurrent < 0 {
			return fieldErr("admission.tenants", "limits must be ≥ 0 (0 = unlimited), got %+v", l)
		}
		if err := l.validateWindows(); err != nil {
			return err
		}
	}
	return nil
}
