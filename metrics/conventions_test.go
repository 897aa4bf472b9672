package metrics

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// These conventions follow the Prometheus naming guide
// (https://prometheus.io/docs/practices/naming/) and OpenMetrics: base units, unit
// suffixes, _total on counters, bounded label values. The test is written over
// Inventory(), so it covers every metric any area adds to the Set.

var snake = regexp.MustCompile(`^[a-z][a-z0-9_]*[a-z0-9]$`)

// unitSuffixes are the units a histogram or summary may be measured in.
var unitSuffixes = []string{"_seconds", "_bytes", "_tokens", "_blocks", "_ratio", "_requests", "_entries", "_events"}

// nonBaseUnits are units Prometheus asks to express in base units instead.
var nonBaseUnits = []string{"_milliseconds", "_ms", "_microseconds", "_us", "_nanoseconds", "_minutes", "_hours", "_kb", "_mb", "_kilobytes", "_megabytes", "_percent"}

// timeWords mark a metric that measures time, which must then be in seconds.
var timeWords = []string{"duration", "latency", "time", "ttft", "wait", "delay", "age"}

// freeFormLabels are label names whose values would come from clients (unbounded
// cardinality, and private data). Never use them.
// ("path" is allowed: kvroute uses it for a fixed set of tokenization paths.)
var freeFormLabels = []string{"user", "user_id", "prompt", "request_id", "session", "session_id", "url", "uri", "url_path", "http_path",
	"api_key", "client", "client_ip", "ip", "host", "header", "body", "message", "error", "err", "conversation", "cache_salt", "lora"}

// boundedIfDocumented are label names that look client-supplied but are allowed when
// their bound is documented: in the metric's help text, or once for all metrics in the
// introduction of docs/metrics.md (see documentedCentrally).
var boundedIfDocumented = []string{"model", "adapter", "lora_name", "tenant"}

func inventory(t *testing.T) []*dto.MetricFamily {
	t.Helper()
	fs, err := Inventory()
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) == 0 {
		t.Fatal("Inventory returned no metrics")
	}
	return fs
}

func labelNames(f *dto.MetricFamily) []string {
	var out []string
	if len(f.GetMetric()) > 0 {
		for _, l := range f.GetMetric()[0].GetLabel() {
			out = append(out, l.GetName())
		}
	}
	return out
}

func hasAnySuffix(s string, sfx []string) bool {
	return slices.ContainsFunc(sfx, func(x string) bool { return strings.HasSuffix(s, x) })
}

// nameWords splits a metric name into its snake_case words.
func nameWords(name string) []string { return strings.Split(name, "_") }

// documentedCentrally reports the labels whose bound the introduction of
// docs/metrics.md (the text before its first section) states: the label in backquotes
// together with "configured" and `other`.
func documentedCentrally(t *testing.T) map[string]bool {
	t.Helper()
	text, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	intro, _, _ := strings.Cut(string(text), "\n## ")
	out := map[string]bool{}
	for _, l := range boundedIfDocumented {
		if strings.Contains(intro, "`"+l+"`") && strings.Contains(intro, "configured") && strings.Contains(intro, "`other`") {
			out[l] = true
		}
	}
	return out
}

// violations lists how f breaks the conventions; central names the labels whose bound
// docs/metrics.md states for every metric.
func violations(f *dto.MetricFamily, central map[string]bool) []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(f.GetName()+": "+format, args...)) }
	name, typ := f.GetName(), f.GetType()
	if !strings.HasPrefix(name, Namespace+"_") {
		bad("every kvroute metric is prefixed %s_ (use Namespace)", Namespace)
	}
	if !snake.MatchString(name) || strings.Contains(name, "__") {
		bad("names are lower snake_case")
	}
	if f.GetHelp() == "" {
		bad("needs help text (what, unit, source)")
	}
	if hasAnySuffix(name, nonBaseUnits) || hasAnySuffix(strings.TrimSuffix(name, "_total"), nonBaseUnits) {
		bad("use base units (seconds, bytes, ratio 0..1), not %v", nonBaseUnits)
	}
	isTime := slices.ContainsFunc(nameWords(name), func(w string) bool { return slices.Contains(timeWords, w) })
	switch typ {
	case dto.MetricType_COUNTER:
		if !strings.HasSuffix(name, "_total") {
			bad("counters end in _total")
		}
	case dto.MetricType_HISTOGRAM, dto.MetricType_SUMMARY, dto.MetricType_GAUGE_HISTOGRAM:
		if !hasAnySuffix(name, unitSuffixes) {
			bad("a %s names its unit, one of %v", typ, unitSuffixes)
		}
		if isTime && !strings.HasSuffix(name, "_seconds") {
			bad("a %s of time ends in _seconds", typ)
		}
	default:
		if strings.HasSuffix(name, "_total") {
			bad("only counters end in _total (this is a %s)", typ)
		}
		if isTime && !strings.HasSuffix(name, "_seconds") {
			bad("a gauge of time is in seconds (_seconds or _timestamp_seconds)")
		}
	}
	help := strings.ToLower(f.GetHelp())
	for _, l := range labelNames(f) {
		if !snake.MatchString(l) && len(l) > 1 {
			bad("label %q is not snake_case", l)
		}
		if slices.Contains(freeFormLabels, l) {
			bad("label %q would carry client-supplied values (unbounded, private); aggregate instead", l)
		}
		if slices.Contains(boundedIfDocumented, l) && !central[l] && !(strings.Contains(help, "configured") && strings.Contains(help, `"other"`)) {
			bad(`label %q must be bounded: values from the configuration only, anything else reported as "other" — say so in the help text (words "configured" and "other") or in the introduction of docs/metrics.md`, l)
		}
	}
	return out
}

func TestMetricConventions(t *testing.T) {
	central := documentedCentrally(t)
	if !central["model"] {
		t.Error("docs/metrics.md's introduction must state that `model` label values are configured names, anything else `other`")
	}
	for _, f := range inventory(t) {
		for _, v := range violations(f, central) {
			t.Error(v)
		}
	}
}

// The rules themselves, proven on synthetic families.
func TestConventionRulesCatchViolations(t *testing.T) {
	counter, hist, gauge := dto.MetricType_COUNTER, dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE
	fam := func(name, help string, typ dto.MetricType, labels ...string) *dto.MetricFamily {
		m := &dto.Metric{}
		for _, l := range labels {
			m.Label = append(m.Label, &dto.LabelPair{Name: &l, Value: new(string)})
		}
		return &dto.MetricFamily{Name: &name, Help: &help, Type: &typ, Metric: []*dto.Metric{m}}
	}
	for what, f := range map[string]*dto.MetricFamily{
		"no prefix":                  fam("router_decisions_total", "h", counter),
		"counter without _total":     fam("kvroute_x_requests", "h", counter),
		"time histogram in ms":       fam("kvroute_x_duration_milliseconds", "h", hist),
		"histogram without unit":     fam("kvroute_x_latency", "h", hist),
		"time histogram not seconds": fam("kvroute_x_wait_tokens", "h", hist),
		"gauge ending in _total":     fam("kvroute_x_total", "h", gauge),
		"no help":                    fam("kvroute_x_total", "", counter),
		"camelCase":                  fam("kvroute_xRequests_total", "h", counter),
		"free-form label":            fam("kvroute_x_total", "h", counter, "prompt"),
		"undocumented model label":   fam("kvroute_x_total", "by model", counter, "model"),
	} {
		if len(violations(f, nil)) == 0 {
			t.Errorf("%s (%s) must violate the conventions", what, f.GetName())
		}
	}
	ok := fam("kvroute_x_total", `By configured model; any other model is "other".`, counter, "model", "worker")
	if v := violations(ok, nil); len(v) != 0 {
		t.Errorf("a documented bounded model label is fine: %v", v)
	}
	if v := violations(fam("kvroute_x_total", "by model", counter, "model"), map[string]bool{"model": true}); len(v) != 0 {
		t.Errorf("a model label documented centrally is fine: %v", v)
	}
}
