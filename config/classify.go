package config

import (
	"fmt"
	"slices"
)

// Classify is the classify stage between parsing and admission, the same in `serve`
// (ext_proc) and `proxy` (package classify, docs/classification.md). With no rules the
// stage is off and costs nothing.
type Classify struct {
	// Model is a linear model file written by `kvroute classify train`; "" none (rules
	// may not then match on labels). Loaded once at start-up.
	Model string `mapstructure:"model"`
	// Rules are tried in order; the first that matches decides.
	Rules []ClassifyRule `mapstructure:"rules"`
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
