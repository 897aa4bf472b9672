package config

import (
	"slices"
	"strings"
	"time"
)

// Class is one QoS class of admission.classes: which requests belong to it (Match) and
// how they are served — dispatch priority, TTFT objective and whether, how many and how
// long they may wait in kvroute's queue (package admission, "Queue").
type Class struct {
	// Name is the class label value (metrics, /debug/admission) and the
	// x-kvroute-class response header; unique, [a-z0-9_-], ≤ 32 bytes.
	Name string `mapstructure:"name" json:"name"`
	// Priority orders dispatch from the queue: a higher band is always served first,
	// and under a full queue the lowest band is shed first. Any integer.
	Priority int `mapstructure:"priority" json:"priority"`
	// TTFTObjective is the class's TTFT objective: a request's x-slo-ttft-ms is capped
	// by it (the smaller wins), and with a queue the request waits while no worker is
	// predicted to meet it. 0: none (x-slo-ttft-ms alone).
	TTFTObjective time.Duration `mapstructure:"ttft_objective" json:"ttft_objective"`
	// QueueLimit is how many of the class's requests may wait at once; 0 turns the
	// queue off for the class (a request that would wait is picked at once, as before).
	QueueLimit int `mapstructure:"queue_limit" json:"queue_limit"`
	// MaxQueueTime is how long one request may wait; past it the request is answered
	// 429 with x-kvroute-rejected-reason: queue_timeout. Required (> 0) with QueueLimit.
	MaxQueueTime time.Duration `mapstructure:"max_queue_time" json:"max_queue_time"`
	// OnSLOMiss is what happens to a request of the class that no worker is predicted
	// to start within its objective (the class's ttft_objective, or the client's
	// x-slo-ttft-ms when smaller): "admit" (the default; it goes to the best worker and
	// probably misses) or "refuse" (answered 429 at once, x-kvroute-rejected-reason:
	// slo_miss, Retry-After the predicted drain time, so its share of the fleet serves
	// requests that can still meet theirs). With a queue, a request that would wait is
	// refused instead when no worker is predicted in time.
	OnSLOMiss string `mapstructure:"on_slo_miss" json:"on_slo_miss,omitempty"`
	// SLOAttainment is the share of the class's requests that should meet its
	// objective, in [0.5, 0.999]; 0 = 0.9. Refusal calibrates to it (the margin of a
	// refusing class settles where 1 − SLOAttainment of its admitted requests miss), and
	// while a class meets its objective less often than this, every refusing class of
	// lower priority is refused at a tighter threshold (docs/tenants.md).
	SLOAttainment float64 `mapstructure:"slo_attainment" json:"slo_attainment,omitempty"`
	// Match selects the class's requests; the first class in the list that matches
	// wins. An empty Match matches every request.
	Match ClassMatch `mapstructure:"match" json:"match"`
}

// Class.OnSLOMiss values.
const (
	SLOMissAdmit  = "admit"
	SLOMissRefuse = "refuse"
)

// ClassMatch are a class's rules; every rule that is set must hold (AND); each list
// matches when any of its values does (OR).
type ClassMatch struct {
	Tenants []string `mapstructure:"tenants" json:"tenants,omitempty"` // admission identity tenant
	// APIs are request APIs: chat, completions, messages, other (the request path).
	APIs   []string `mapstructure:"apis" json:"apis,omitempty"`
	Models []string `mapstructure:"models" json:"models,omitempty"` // the request's model
	// Headers are exact request header values (lower-case names). Headers are set by the
	// client unless the edge strips them: match on them only for what clients may choose.
	Headers map[string]string `mapstructure:"headers" json:"headers,omitempty"`
	// Claims are exact values of verified JWT claims (ext_proc metadata_context at
	// admission.metadata_namespace/metadata_key; never in proxy).
	Claims map[string]string `mapstructure:"claims" json:"claims,omitempty"`
	// MinPromptTokens and MaxPromptTokens bound the prompt length in tokens as the router
	// counted it (0: no bound; a request without a token count matches no bound).
	MinPromptTokens int `mapstructure:"min_prompt_tokens" json:"min_prompt_tokens,omitempty"`
	MaxPromptTokens int `mapstructure:"max_prompt_tokens" json:"max_prompt_tokens,omitempty"`
}

// DefaultClass is the class of a request no configured class matches (priority 0, no
// objective, no queue), unless admission.classes names its own "default".
const DefaultClass = "default"

// MaxQueueTime is the longest max_queue_time of any class with a queue (0: no queue):
// what Envoy's ext_proc message_timeout must exceed (envoy.Check, docs/tenants.md).
func (a Admission) MaxQueueTime() time.Duration {
	var d time.Duration
	for _, c := range a.Classes {
		if c.QueueLimit > 0 {
			d = max(d, c.MaxQueueTime)
		}
	}
	return d
}

func validClassName(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

func (a Admission) validateClasses() error {
	seen := map[string]bool{}
	for i, c := range a.Classes {
		if !validClassName(c.Name) || seen[c.Name] {
			return fieldErr("admission.classes", "element %d: name %q is invalid ([a-z0-9_-], ≤ 32 bytes) or listed twice", i, c.Name)
		}
		seen[c.Name] = true
		if c.TTFTObjective < 0 || c.QueueLimit < 0 || c.MaxQueueTime < 0 {
			return fieldErr("admission.classes", "class %q: ttft_objective, queue_limit and max_queue_time must be ≥ 0", c.Name)
		}
		if !slices.Contains([]string{"", SLOMissAdmit, SLOMissRefuse}, c.OnSLOMiss) {
			return fieldErr("admission.classes", "class %q: on_slo_miss %q is not one of admit, refuse", c.Name, c.OnSLOMiss)
		}
		if c.SLOAttainment != 0 && (c.SLOAttainment < 0.5 || c.SLOAttainment > 0.999) {
			return fieldErr("admission.classes", "class %q: slo_attainment must be in [0.5, 0.999], got %v", c.Name, c.SLOAttainment)
		}
		if c.OnSLOMiss == SLOMissRefuse && c.TTFTObjective == 0 {
			return fieldErr("admission.classes", "class %q: on_slo_miss refuse needs a ttft_objective > 0", c.Name)
		}
		if c.QueueLimit > 0 && c.MaxQueueTime == 0 {
			return fieldErr("admission.classes", "class %q: queue_limit %d needs max_queue_time > 0", c.Name, c.QueueLimit)
		}
		if c.MaxQueueTime > time.Hour {
			return fieldErr("admission.classes", "class %q: max_queue_time %s is over 1h", c.Name, c.MaxQueueTime)
		}
		m := c.Match
		for _, api := range m.APIs {
			if !slices.Contains([]string{"chat", "completions", "messages", "other"}, api) {
				return fieldErr("admission.classes", "class %q: api %q is not one of chat, completions, messages, other", c.Name, api)
			}
		}
		for h := range m.Headers {
			if h != strings.ToLower(h) {
				return fieldErr("admission.classes", "class %q: header %q must be lower case", c.Name, h)
			}
		}
		if m.MinPromptTokens < 0 || m.MaxPromptTokens < 0 || (m.MaxPromptTokens > 0 && m.MaxPromptTokens < m.MinPromptTokens) {
			return fieldErr("admission.classes", "class %q: prompt token bounds [%d, %d] are invalid", c.Name, m.MinPromptTokens, m.MaxPromptTokens)
		}
	}
	if a.QueueMax < 1 {
		return fieldErr("admission.queue_max", "must be ≥ 1, got %d", a.QueueMax)
	}
	return nil
}
