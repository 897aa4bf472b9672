package classify

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/jsonvalue"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
)

// RuleSpec is one classification rule as configured (config.ClassifyRule: match
// fields and actions).
type RuleSpec = config.ClassifyRule

// TagHeader is the upstream header a rule with Tag sets: "rule=NAME; label=LABEL".
const TagHeader = "x-kvroute-classification"

type rule struct {
	RuleSpec
	re                 *regexp.Regexp
	hdrName, hdrValue  string
	hdrValueSet, anyPI bool
}

// Rules is a compiled, validated rule list: read-only, safe for concurrent use.
type Rules struct {
	rules     []rule
	model     atomic.Pointer[Linear] // nil: no rule may use Labels; replaced by SetModel
	labels    []string               // the model labels rules use (SetModel keeps them)
	remote    *Remote                // nil: no rule may use RemoteLabels
	needLabel bool
	needPII   bool
	decisions *prometheus.CounterVec // rule, label, action; nil: not counted
	rewrites  *prometheus.CounterVec // rule, outcome; nil: not counted
}

// Count makes Decide count every decision in m (kvroute_classify_decisions_total) and
// Rewrite every model rewrite (kvroute_classify_rewrites_total).
func (rs *Rules) Count(m *metrics.Classify) { rs.decisions, rs.rewrites = m.Decisions, m.Rewrites }

func (rs *Rules) count(d Decision) Decision {
	if rs.decisions != nil {
		rule, label := d.Rule, d.Label
		if rule == "" {
			rule = "none"
		}
		if label == "" {
			label = "none"
		}
		rs.decisions.WithLabelValues(rule, label, d.Action()).Inc()
	}
	return d
}

// Classifiers are the classifiers rules may match on besides the request itself; a nil
// one is not configured.
type Classifiers struct {
	Model  *Linear // Labels
	Remote *Remote // RemoteLabels
}

// Compile is CompileWith with only a linear model (nil when none is loaded).
func Compile(specs []RuleSpec, model *Linear, classes []string) (*Rules, error) {
	return CompileWith(specs, Classifiers{Model: model}, classes)
}

// CompileWith validates specs against the classifiers and the admission class names
// (classes; "default" is always one): a rule needs a name (unique), at least one match
// field and one action; Labels must exist in the model, RemoteLabels need a remote;
// PII types must be known; Regex must compile; Class must be a class. Errors name the
// rule.
func CompileWith(specs []RuleSpec, c Classifiers, classes []string) (*Rules, error) {
	model := c.Model
	rs := &Rules{remote: c.Remote}
	rs.model.Store(model)
	seen := map[string]bool{}
	for i, s := range specs {
		name := s.Name
		if name == "" {
			return nil, fmt.Errorf("classify.rules[%d]: a rule needs a name", i)
		}
		if seen[name] {
			return nil, fmt.Errorf("classify.rules[%d]: name %q is used twice", i, name)
		}
		seen[name] = true
		r := rule{RuleSpec: s}
		fail := func(format string, a ...any) error {
			return fmt.Errorf("classify rule %q: %s", name, fmt.Sprintf(format, a...))
		}
		if len(s.Labels) == 0 && len(s.PII) == 0 && len(s.Paths) == 0 && len(s.Models) == 0 &&
			len(s.Tenants) == 0 && s.Header == "" && s.Regex == "" && len(s.RemoteLabels) == 0 {
			return nil, fail("no match field (labels, remote_labels, pii, paths, models, tenants, header, regex)")
		}
		if len(s.RemoteLabels) > 0 && c.Remote == nil {
			return nil, fail("remote_labels need classify.remote.url")
		}
		switch s.RemoteFail {
		case "", "open":
		case "closed":
			if len(s.RemoteLabels) == 0 {
				return nil, fail("remote_fail needs remote_labels")
			}
		default:
			return nil, fail("remote_fail %q, want open or closed", s.RemoteFail)
		}
		if !s.Refuse && s.Class == "" && len(s.Workers) == 0 && s.Model == "" && !s.Tag {
			return nil, fail("no action (refuse, class, workers, model, tag)")
		}
		if s.Refuse && (s.Class != "" || len(s.Workers) > 0 || s.Model != "") {
			return nil, fail("refuse cannot be combined with class, workers or model")
		}
		for _, w := range s.Workers {
			if _, err := netip.ParseAddrPort(w); err != nil {
				return nil, fail("worker %q is not an ip:port address", w)
			}
		}
		if s.Class != "" && s.Class != config.DefaultClass && !slices.Contains(classes, s.Class) {
			return nil, fail("class %q is not one of admission.classes %v", s.Class, classes)
		}
		if s.MinConfidence < 0 || s.MinConfidence > 1 {
			return nil, fail("min_confidence %g outside 0..1", s.MinConfidence)
		}
		switch s.Over {
		case "", "last_user", "system", "both":
		default:
			return nil, fail("over %q, want last_user, system or both", s.Over)
		}
		if len(s.Labels) > 0 {
			if model == nil {
				return nil, fail("labels need classify.model")
			}
			for _, l := range s.Labels {
				if !slices.Contains(model.Labels, l) {
					return nil, fail("label %q is not one of the model's %v", l, model.Labels)
				}
				if !slices.Contains(rs.labels, l) {
					rs.labels = append(rs.labels, l)
				}
			}
			rs.needLabel = true
		}
		for _, p := range s.PII {
			if p == "any" {
				r.anyPI = true
			} else if !slices.Contains(PIITypes, p) {
				return nil, fail("pii type %q, want one of %v or any", p, PIITypes)
			}
			rs.needPII = true
		}
		if s.Regex != "" {
			re, err := regexp.Compile(s.Regex)
			if err != nil {
				return nil, fail("regex: %v", err)
			}
			r.re = re
		}
		if s.Header != "" {
			n, v, ok := strings.Cut(s.Header, "=")
			r.hdrName, r.hdrValue, r.hdrValueSet = strings.TrimSpace(n), strings.TrimSpace(v), ok
			if r.hdrName == "" {
				return nil, fail("header %q has no name", s.Header)
			}
		}
		rs.rules = append(rs.rules, r)
	}
	return rs, nil
}

// SetModel replaces the linear model the rules read (a reload), for the decisions that
// start after it; m must have every label a rule matches on, else the model in use is
// kept and the error names the missing labels.
func (rs *Rules) SetModel(m *Linear) error {
	if m == nil {
		return fmt.Errorf("classify: no model")
	}
	var missing []string
	for _, l := range rs.labels {
		if !slices.Contains(m.Labels, l) {
			missing = append(missing, l)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("classify: the model lacks labels %v that rules match on", missing)
	}
	rs.model.Store(m)
	return nil
}

// Model is the linear model in use (nil: none).
func (rs *Rules) Model() *Linear { return rs.model.Load() }

// Input is what a front knows about a request at the classify stage.
type Input struct {
	Path   string
	Tenant string
	Header func(name string) string // nil: no headers
	Req    *request.Request
	Ctx    context.Context // bounds a remote classifier's call; nil: none but its timeout
}

// Decision is the outcome of Rules.Decide. Rule is "" when no rule matched (then
// nothing else is set but the labels and confidences of the classifiers that ran). A
// front answers a Refuse with 403 permission_error in the request's API shape, and
// Unavailable (a remote_fail closed rule whose remote classifier did not answer) with
// 503 (front.ErrorReply).
type Decision struct {
	Rule       string
	Label      string // the linear model's
	Confidence float64
	// RemoteLabel and RemoteConfidence are the remote classifier's, when it answered.
	RemoteLabel      string
	RemoteConfidence float64
	Unavailable      bool
	Refuse           bool
	Class            string
	Workers          []string    // "ip:port": restrict the pick to them
	Model            string      // rewrite the request's model to this (Rules.Rewrite)
	Header           [][2]string // upstream headers to set
}

// Action names the decision for a bounded metric label: "none", "unavailable",
// "refuse", "class", "workers", "model" or "tag" (the first that applies).
func (d Decision) Action() string {
	switch {
	case d.Rule == "":
		return "none"
	case d.Unavailable:
		return "unavailable"
	case d.Refuse:
		return "refuse"
	case d.Class != "":
		return "class"
	case len(d.Workers) > 0:
		return "workers"
	case d.Model != "":
		return "model"
	}
	return "tag"
}

// Decide runs the model and the recognizers only when a rule needs them, once each per
// text, then the rules in order. Cost: the model's window, FindPII over the text, each
// rule's regex.
func (rs *Rules) Decide(in Input) Decision { return rs.count(rs.decide(in)) }

// Explain is Decide without counting the decision, for /debug/explain (a remote
// classifier a rule needs is still called, and its answer counted, as for a request).
func (rs *Rules) Explain(in Input) Decision { return rs.decide(in) }

func (rs *Rules) decide(in Input) Decision {
	var d Decision
	model := rs.model.Load() // one model for the whole decision, whatever SetModel does meanwhile
	last, system := lastUser(in.Req), systemText(in.Req)
	type textFacts struct {
		done       bool
		pred       Prediction
		pii        []Span
		remoteDone bool
		remote     Prediction
		remoteErr  error
	}
	var facts [3]textFacts // last_user, system, both
	textOf := func(over string) (string, *textFacts) {
		switch over {
		case "system":
			return system, &facts[1]
		case "both":
			if system == "" {
				return last, &facts[0]
			}
			return system + "\n" + last, &facts[2]
		}
		return last, &facts[0]
	}
	get := func(over string) (string, *textFacts) {
		t, f := textOf(over)
		if !f.done {
			f.done = true
			if rs.needLabel && model != nil {
				f.pred = model.Predict(t)
			}
			if rs.needPII {
				f.pii = FindPII(nil, t)
			}
		}
		return t, f
	}
	for i := range rs.rules {
		r := &rs.rules[i]
		if len(r.Paths) > 0 && !slices.Contains(r.Paths, in.Path) ||
			len(r.Tenants) > 0 && !slices.Contains(r.Tenants, in.Tenant) ||
			len(r.Models) > 0 && (in.Req == nil || !slices.Contains(r.Models, in.Req.Model)) {
			continue
		}
		if r.hdrName != "" {
			v := ""
			if in.Header != nil {
				v = in.Header(r.hdrName)
			}
			if v == "" || r.hdrValueSet && v != r.hdrValue {
				continue
			}
		}
		t, f := get(r.Over)
		if len(r.Labels) > 0 && (!slices.Contains(r.Labels, f.pred.Label) || f.pred.Confidence < r.MinConfidence) {
			continue
		}
		if len(r.PII) > 0 && !piiMatch(r, f.pii) {
			continue
		}
		if r.re != nil && !r.re.MatchString(t) {
			continue
		}
		if len(r.RemoteLabels) > 0 { // last: the costliest, a call
			if !f.remoteDone {
				f.remoteDone = true
				ctx := in.Ctx
				if ctx == nil {
					ctx = context.Background()
				}
				f.remote, f.remoteErr = rs.remote.lookup(ctx, t)
			}
			if f.remoteErr != nil {
				if r.RemoteFail == "closed" {
					return Decision{Rule: r.Name, Label: f.pred.Label, Confidence: f.pred.Confidence, Unavailable: true}
				}
				continue // open: an unavailable remote gives no label
			}
			if !slices.Contains(r.RemoteLabels, f.remote.Label) || f.remote.Confidence < r.MinConfidence {
				continue
			}
		}
		d = Decision{Rule: r.Name, Label: f.pred.Label, Confidence: f.pred.Confidence,
			RemoteLabel: f.remote.Label, RemoteConfidence: f.remote.Confidence,
			Refuse: r.Refuse, Class: r.Class, Workers: r.Workers, Model: r.Model}
		if r.Tag {
			v := "rule=" + r.Name
			if d.Label != "" {
				v += "; label=" + d.Label
			}
			if len(r.RemoteLabels) > 0 {
				v += "; remote_label=" + d.RemoteLabel
			}
			d.Header = append(d.Header, [2]string{TagHeader, v})
		}
		return d
	}
	if rs.needLabel {
		_, f := get("")
		d.Label, d.Confidence = f.pred.Label, f.pred.Confidence
	}
	d.RemoteLabel, d.RemoteConfidence = facts[0].remote.Label, facts[0].remote.Confidence
	return d
}

func piiMatch(r *rule, spans []Span) bool {
	for _, s := range spans {
		if r.anyPI || slices.Contains(r.PII, s.Type) {
			return true
		}
	}
	return false
}

// lastUser is the text of the last message with role "user" (string content, or the
// "text" of its text parts), or the last completions prompt.
func lastUser(r *request.Request) string {
	if r == nil {
		return ""
	}
	for i := len(r.Messages) - 1; i >= 0; i-- {
		if role, _ := r.Messages[i].Field("role").Str(); role == "user" {
			return contentText(r.Messages[i].Field("content"))
		}
	}
	if n := len(r.Prompts); n > 0 {
		return r.Prompts[n-1]
	}
	return ""
}

// systemText is Anthropic's top-level system, else the first message with role
// "system" or "developer".
func systemText(r *request.Request) string {
	if r == nil {
		return ""
	}
	if !r.System.IsNull() {
		return contentText(r.System)
	}
	for _, m := range r.Messages {
		if role, _ := m.Field("role").Str(); role == "system" || role == "developer" {
			return contentText(m.Field("content"))
		}
	}
	return ""
}

func contentText(v jsonvalue.Value) string {
	if s, ok := v.Str(); ok {
		return s
	}
	if v.Kind() != jsonvalue.Array {
		return ""
	}
	var sb strings.Builder
	for i := 0; i < v.Len(); i++ {
		if s, ok := v.Index(i).Field("text").Str(); ok {
			if sb.Len() > 0 {
				sb.WriteByte('\n')
			}
			sb.WriteString(s)
		}
	}
	return sb.String()
}
