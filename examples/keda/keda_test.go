// Package keda holds the example KEDA ScaledObject (scaledobject.yaml); the test checks
// it is a ScaledObject whose Prometheus triggers query metrics kvroute exports, with
// the labels they have (docs/metrics.md, generated from the code).
package keda

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/kvroute/kvroute/examples/grafana"
)

type scaledObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Spec       struct {
		ScaleTargetRef struct {
			Name string `yaml:"name"`
		} `yaml:"scaleTargetRef"`
		Triggers []struct {
			Type       string            `yaml:"type"`
			MetricType string            `yaml:"metricType"`
			Metadata   map[string]string `yaml:"metadata"`
		} `yaml:"triggers"`
	} `yaml:"spec"`
}

// row matches a line of the generated metric table: | `name` | type | labels | help |
var row = regexp.MustCompile("^\\| `(kvroute_[a-z0-9_]+)` \\| [a-z]+ \\| ([a-z_, ]*) \\|")

func TestScaledObjectQueriesExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile("scaledobject.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var so scaledObject
	if err := yaml.Unmarshal(raw, &so); err != nil {
		t.Fatal(err)
	}
	if so.APIVersion != "keda.sh/v1alpha1" || so.Kind != "ScaledObject" || so.Spec.ScaleTargetRef.Name == "" || len(so.Spec.Triggers) != 3 {
		t.Fatalf("not the expected ScaledObject: %+v", so)
	}
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string][]string{}
	for _, l := range strings.Split(string(doc), "\n") {
		if m := row.FindStringSubmatch(l); m != nil {
			labels[m[1]] = strings.Split(strings.ReplaceAll(m[2], " ", ""), ",")
		}
	}
	if len(labels) < 50 {
		t.Fatalf("read %d metrics from docs/metrics.md: the table format changed", len(labels))
	}
	for _, tr := range so.Spec.Triggers {
		q := tr.Metadata["query"]
		if tr.Type != "prometheus" || q == "" || tr.Metadata["threshold"] == "" || tr.Metadata["serverAddress"] == "" {
			t.Errorf("trigger %+v: want a prometheus trigger with serverAddress, query and threshold", tr)
			continue
		}
		// A per-fleet signal (drain time, refusal rate) must be compared as is: KEDA's
		// default AverageValue divides it by the replica count, so a busy fleet would
		// be scaled down. Only the summed queued tokens are a per-replica average.
		want := "Value"
		if strings.Contains(q, "in_flight_prefill_tokens") {
			want = "AverageValue"
		}
		if tr.MetricType != want {
			t.Errorf("%q: metricType %q, want %q", q, tr.MetricType, want)
		}
		refs, err := grafana.Scan(q)
		if err != nil {
			t.Errorf("%q: %v", q, err)
			continue
		}
		for _, s := range refs.Selectors {
			ls, ok := labels[s.Metric]
			if !ok {
				t.Errorf("%q: metric %s is not exported", q, s.Metric)
			}
			for _, l := range s.Labels {
				if !slices.Contains(ls, l) {
					t.Errorf("%q: %s has no label %s (has %v)", q, s.Metric, l, ls)
				}
			}
		}
	}
}
