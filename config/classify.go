package config

import (
	"fmt"
	"net/url"
	"slices"
	"time"
)

// Classify is the classify stage between parsing and admission, the same in `serve`
// (ext_proc) and `proxy` (package classify, docs/classification.md). With no rules the
// stage is off and costs nothing.
type Classify struct {
	// Model is a linear model file written by `kvroute classify train`; "" none (rules
	// may not then match on labels). Loaded at start-up, reloaded on change.
	Model string `mapstructure:"model"`
	// ReloadInterval is how often the model file's modification time and size are
	// checked; a changed file is loaded and replaces the model unless it is bad (the
	// model in use is then kept). 0: never reloaded.
	ReloadInterval time.Duration `mapstructure:"reload_interval"`
	// Remote is an HTTP classifier that rules may match on (remote_labels).
	Remote ClassifyRemote `mapstructure:"remote"`
	// Rules are tried in order; the first that matches decides.
	Rules []ClassifyRule `mapstructure:"rules"`
}

// ClassifyRemote is a sequence-classification model served over HTTP in the shape of
// vLLM's pooling endpoint POST /classify (package classify's Remote).
type ClassifyRemote struct {
	// URL is the endpoint, e.g. http://10.0.0.9:8000/classify; "" none (rules may not
	// then match on remote_labels).
	URL string `mapstructure:"url"`
	// Model is the "model" field sent: the served model name. Required with URL.
	Model string `mapstructure:"model"`
	// Timeout bounds one call, the wait for a slot included.
	Timeout time.Duration `mapstructure:"timeout"`
	// MaxConcurrency bounds the calls in flight.
	MaxConcurrency int `mapstructure:"max_concurrency"`
	// CacheSize bounds the answers kept, keyed by a hash of the text; 0 none.
	CacheSize int `mapstructure:"cache_size"`
	// MaxInputBytes cuts the text sent to its first bytes.
	MaxInputBytes int `mapstructure:"max_input_bytes"`
}

func defaultClassify() Classify {
	return Classify{ReloadInterval: 30 * time.Second, Remote: ClassifyRemote{Timeout: 50 * time.Millisecond, MaxConcurrency: 16, CacheSize: 10000, MaxInputBytes: 8 << 10}}
}

// ClassifyRule is one classification rule. Every match field that is set must hold (an
// empty field matches anything); each list matches when any of its values does.
// Validated at start-up by classify.Compile (names unique, at least one match and one
// action, labels in the model, known PII types, RE2 regexes, a class admission knows).
type ClassifyRule struct {
	Name string `mapstructure:"name" json:"name"`

	// Labels matches when the linear model's label is one of them with at least
	// MinConfidence (0..1).
	Labels        []string `mapstructure:"labels" json:"labels,omitempty"`
	MinConfidence float64  `mapstructure:"min_confidence" json:"min_confidence,omitempty"`
	// PII matches when the text holds a span of one of these types (classify.PIITypes,
	// or "any").
	PII []string `mapstructure:"pii" json:"pii,omitempty"`
	// Paths, Models and Tenants match the request path, the body's model and the
	// admitted tenant exactly.
	Paths   []string `mapstructure:"paths" json:"paths,omitempty"`
	Models  []string `mapstructure:"models" json:"models,omitempty"`
	Tenants []string `mapstructure:"tenants" json:"tenants,omitempty"`
	// Header is "name" (present) or "name=value" (equal), lower-case name.
	Header string `mapstructure:"header" json:"header,omitempty"`
	// Regex is an RE2 expression searched in the text named by Over.
	Regex string `mapstructure:"regex" json:"regex,omitempty"`
	// Over names the text that Labels, PII and Regex read: "last_user" (default),
	// "system" or "both" (system prompt, a newline, last user message).
	Over string `mapstructure:"over" json:"over,omitempty"`
	// RemoteLabels matches when the remote classifier (classify.remote) gives one of
	// these labels with at least MinConfidence, for the text named by Over.
	RemoteLabels []string `mapstructure:"remote_labels" json:"remote_labels,omitempty"`
	// RemoteFail is what an unavailable remote classifier (an error, a timeout, no free
	// slot) means for this rule: "open" (default) the rule does not match; "closed" the
	// request is answered 503.
	RemoteFail string `mapstructure:"remote_fail" json:"remote_fail,omitempty"`

	// Refuse answers 403 permission_error in the request's API shape.
	Refuse bool `mapstructure:"refuse" json:"refuse,omitempty"`
	// Class puts the request in this admission class (admission.classes, or "default"),
	// ahead of the classes' own matches.
	Class string `mapstructure:"class" json:"class,omitempty"`
	// Workers restricts the pick to these workers, by "ip:port" address (intersected with
	// a Gateway API Inference Extension subset hint when Envoy sends one): a pool.
	Workers []string `mapstructure:"workers" json:"workers,omitempty"`
	// Model rewrites the request's "model" field to this served model name (a cheap
	// model for simple requests): the body sent upstream carries it and the pick is made
	// among its workers. With a models list it must be one of them.
	Model string `mapstructure:"model" json:"model,omitempty"`
	// Tag sets the upstream header x-kvroute-classification: "rule=NAME; label=LABEL"
	// (with Envoy in front and extproc.clear_route_cache, a route may match on it).
	Tag bool `mapstructure:"tag" json:"tag,omitempty"`
}

// validate checks what needs the rest of the configuration: a rule's model rewrite
// names a configured model when models are listed. The rules themselves are compiled
// at start-up by classify.Compile.
func (c Classify) validate(models []Model) error {
	if c.ReloadInterval < 0 {
		return fieldErr("classify.reload_interval", "must be ≥ 0 (0: off), got %s", c.ReloadInterval)
	}
	if r := c.Remote; r.URL != "" {
		u, err := url.Parse(r.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fieldErr("classify.remote.url", "must be an http:// or https:// URL with a host, got %q", r.URL)
		}
		if r.Model == "" {
			return fieldErr("classify.remote.model", "is required with classify.remote.url")
		}
	}
	switch {
	case c.Remote.Timeout <= 0:
		return fieldErr("classify.remote.timeout", "must be > 0, got %s", c.Remote.Timeout)
	case c.Remote.MaxConcurrency < 1:
		return fieldErr("classify.remote.max_concurrency", "must be ≥ 1, got %d", c.Remote.MaxConcurrency)
	case c.Remote.CacheSize < 0:
		return fieldErr("classify.remote.cache_size", "must be ≥ 0, got %d", c.Remote.CacheSize)
	case c.Remote.MaxInputBytes < 1:
		return fieldErr("classify.remote.max_input_bytes", "must be ≥ 1, got %d", c.Remote.MaxInputBytes)
	}
	var names []string
	for _, m := range models {
		names = append(names, m.Name)
	}
	for i, r := range c.Rules {
		if r.Model != "" && len(names) > 0 && !slices.Contains(names, r.Model) {
			return fieldErr(fmt.Sprintf("classify.rules[%d].model", i), "rule %q rewrites to model %q, which is not one of models %v", r.Name, r.Model, names)
		}
	}
	return nil
}
