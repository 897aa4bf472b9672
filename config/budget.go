package config

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// RedisBudget configures admission.backend: redis. Every kvroute replica pointed at
// the same Addr, DB and KeyPrefix shares one budget per tenant: a reservation is
// checked and charged by one Lua script (atomic on the Redis server), settled once
// per ticket by another.
type RedisBudget struct {
	// Addr is the Redis server, host:port.
	Addr string `mapstructure:"addr"`
	// DB is the Redis logical database.
	DB int `mapstructure:"db"`
	// KeyPrefix starts every key kvroute writes (windows, concurrency sets, tickets).
	KeyPrefix string `mapstructure:"key_prefix"`
	// Timeout bounds every Redis call (dial, read and write, and the call as a whole).
	Timeout time.Duration `mapstructure:"timeout"`
	// RetryInterval is how long, after a failed call, the backend treats Redis as down
	// (the Down mode applies) before it tries again.
	RetryInterval time.Duration `mapstructure:"retry_interval"`
	// TicketTTL bounds how long a reservation can hold its concurrency slot and be
	// settled at all (its lease is not renewed past it), and how long the tombstone of
	// a cancelled reservation lasts.
	TicketTTL time.Duration `mapstructure:"ticket_ttl"`
	// LeaseTTL is the life of a reservation's concurrency slot (lease) in Redis unless
	// the replica holding the request renews it (every LeaseTTL/3 while the request is
	// in flight there): a replica that dies, a settlement that is lost, or a
	// reservation that Redis ran after its client gave up (a stall) frees its slot
	// after LeaseTTL, not TicketTTL.
	LeaseTTL time.Duration `mapstructure:"lease_ttl"`
	// Replicas is N, the number of kvroute replicas sharing the budget: in Down mode
	// local, each replica enforces 1/N of every limit on its own.
	Replicas int `mapstructure:"replicas"`
	// Down is what a tenant without its own redis_down gets while Redis is unreachable:
	// "local" (each replica enforces 1/Replicas of the limits in memory), "fail_open"
	// (admit without a budget) or "fail_closed" (refuse with 503).
	Down string `mapstructure:"down"`
	// Username and Password authenticate to Redis (AUTH; Username "" = the default
	// user, as requirepass). Set the password from the environment
	// (KVROUTE_ADMISSION_REDIS_PASSWORD) rather than a file under version control; it is
	// never logged, marshalled (json:"-") or shown by /debug views (LogValue, String).
	Username string `mapstructure:"username"`
	Password string `mapstructure:"password" json:"-"`
	// TLS connects to Redis over TLS (redis-server --tls-port).
	TLS RedisTLS `mapstructure:"tls"`
}

// RedisTLS configures TLS to Redis. The files are PEM and are read at startup
// (admission.New fails on an unreadable or invalid one).
type RedisTLS struct {
	// Enabled turns TLS on; the other keys need it.
	Enabled bool `mapstructure:"enabled"`
	// CAFile verifies the server's certificate ("" = the system roots).
	CAFile string `mapstructure:"ca_file"`
	// CertFile and KeyFile are a client certificate (mutual TLS), set together.
	CertFile string `mapstructure:"cert_file"`
	KeyFile  string `mapstructure:"key_file"`
	// ServerName is the name verified in the server's certificate ("" = the host of
	// addr).
	ServerName string `mapstructure:"server_name"`
}

// String is r without its password (for logs and error messages).
func (r RedisBudget) String() string {
	pw := ""
	if r.Password != "" {
		pw = "[redacted]"
	}
	return fmt.Sprintf("{addr:%s db:%d username:%q password:%s tls:%v}", r.Addr, r.DB, r.Username, pw, r.TLS.Enabled)
}

// LogValue logs r without its password (slog.LogValuer).
func (r RedisBudget) LogValue() slog.Value { return slog.StringValue(r.String()) }

// TokenWindow is a token limit over one fixed window: windows are aligned to the Unix
// epoch (a 24h window is a UTC day).
type TokenWindow struct {
	Window time.Duration `mapstructure:"window" json:"window"`
	Tokens int64         `mapstructure:"tokens" json:"tokens"`
}

// ModelLimits are a tenant's token limits for one model.
type ModelLimits struct {
	Model string `mapstructure:"model" json:"model"`
	// TokensPerMinute and TokenWindows as in Limits (0 / empty: no limit of its own).
	TokensPerMinute int64         `mapstructure:"tokens_per_minute" json:"tokens_per_minute"`
	TokenWindows    []TokenWindow `mapstructure:"token_windows" json:"token_windows,omitempty"`
}

// OutputHistory bounds the learned output estimate: per tenant × model the last
// Samples settled output lengths are kept (a ring), and once MinSamples are there
// their p90 replaces default_output_tokens; at most MaxKeys tenant × model pairs are
// kept (the least recently used is forgotten).
type OutputHistory struct {
	Samples    int `mapstructure:"samples"`
	MinSamples int `mapstructure:"min_samples"`
	MaxKeys    int `mapstructure:"max_keys"`
}

// RedisDownModes are the accepted values of admission.redis.down and redis_down.
var RedisDownModes = []string{"local", "fail_open", "fail_closed"}

func defaultRedisBudget() RedisBudget {
	return RedisBudget{Addr: "127.0.0.1:6379", KeyPrefix: "kvroute:budget:", Timeout: 100 * time.Millisecond,
		RetryInterval: time.Second, TicketTTL: time.Hour, LeaseTTL: 30 * time.Second, Replicas: 1, Down: "local"}
}

func (a Admission) validateBudget() error {
	switch a.Backend {
	case "local":
	case "redis":
		r := a.Redis
		if r.Addr == "" {
			return fieldErr("admission.redis.addr", "backend redis needs an address")
		}
		if r.Timeout <= 0 || r.RetryInterval <= 0 || r.TicketTTL < time.Minute {
			return fieldErr("admission.redis.timeout", "timeout and retry_interval must be > 0 and ticket_ttl ≥ 1m, got %v, %v, %v", r.Timeout, r.RetryInterval, r.TicketTTL)
		}
		if r.LeaseTTL < 3*r.Timeout || r.LeaseTTL < time.Second || r.LeaseTTL > r.TicketTTL {
			return fieldErr("admission.redis.lease_ttl", "must be ≥ 1s and ≥ 3 × timeout (%v) and ≤ ticket_ttl (%v), got %v", r.Timeout, r.TicketTTL, r.LeaseTTL)
		}
		if r.Replicas < 1 {
			return fieldErr("admission.redis.replicas", "must be ≥ 1, got %d", r.Replicas)
		}
		if r.KeyPrefix == "" {
			return fieldErr("admission.redis.key_prefix", "must not be empty")
		}
		if r.Username != "" && r.Password == "" {
			return fieldErr("admission.redis.password", "admission.redis.username %q needs a password (KVROUTE_ADMISSION_REDIS_PASSWORD)", r.Username)
		}
		t := r.TLS
		if !t.Enabled && (t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "") {
			return fieldErr("admission.redis.tls.enabled", "tls.ca_file, cert_file, key_file and server_name need tls.enabled: true")
		}
		if (t.CertFile == "") != (t.KeyFile == "") {
			return fieldErr("admission.redis.tls.cert_file", "cert_file and key_file are set together (got cert %q, key %q)", t.CertFile, t.KeyFile)
		}
	default:
		return fieldErr("admission.backend", "must be local or redis, got %q", a.Backend)
	}
	if !slices.Contains(RedisDownModes, a.Redis.Down) {
		return fieldErr("admission.redis.down", "must be one of %s, got %q", strings.Join(RedisDownModes, ", "), a.Redis.Down)
	}
	h := a.OutputHistory
	if h.Samples < 1 || h.Samples > 1024 || h.MinSamples < 1 || h.MinSamples > h.Samples || h.MaxKeys < 1 {
		return fieldErr("admission.output_history", "need 1 ≤ min_samples ≤ samples ≤ 1024 and max_keys ≥ 1, got %+v", h)
	}
	check := func(l Limits) error {
		if l.RedisDown != "" && !slices.Contains(RedisDownModes, l.RedisDown) {
			return fieldErr("admission.tenants", "redis_down must be one of %s, got %q", strings.Join(RedisDownModes, ", "), l.RedisDown)
		}
		return nil
	}
	if err := check(a.Default); err != nil {
		return err
	}
	for i, t := range a.Tenants {
		if err := check(t.Limits); err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, m := range t.Models {
			if m.Model == "" || seen[m.Model] {
				return fieldErr("admission.tenants", "element %d: model %q is empty or listed twice", i, m.Model)
			}
			seen[m.Model] = true
			if m.TokensPerMinute < 0 {
				return fieldErr("admission.tenants", "element %d model %s: tokens_per_minute must be ≥ 0", i, m.Model)
			}
			if err := (Limits{TokenWindows: m.TokenWindows}).validateWindows(); err != nil {
				return err
			}
		}
	}
	return nil
}

// validateWindows checks token_windows: each window a whole number of seconds ≥ 1s
// and ≤ 31 days, tokens ≥ 1, no window listed twice (a 1m window besides
// tokens_per_minute is allowed: both apply).
func (l Limits) validateWindows() error {
	seen := map[time.Duration]bool{}
	for _, w := range l.TokenWindows {
		if w.Window < time.Second || w.Window > 31*24*time.Hour || w.Window%time.Second != 0 {
			return fieldErr("admission.tenants", "token_windows: window must be whole seconds in [1s, 744h], got %v", w.Window)
		}
		if w.Tokens < 1 || seen[w.Window] {
			return fieldErr("admission.tenants", "token_windows: tokens must be ≥ 1 and each window listed once, got %+v", w)
		}
		seen[w.Window] = true
	}
	return nil
}
