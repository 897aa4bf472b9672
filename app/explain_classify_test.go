package app

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
)

// /debug/explain shows the classify stage's decision and explains the pick as the
// decision shapes it: a rule's pool, a rule's model rewrite; a refusing rule is the whole
// answer. Nothing is counted as a decision.
func TestExplainShowsClassification(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m"}, {Name: "small"}}
	cfg.Workers = []config.Worker{{Name: "a", Address: "127.0.0.1:9001", Models: []string{"m"}}, {Name: "b", Address: "127.0.0.1:9002", Models: []string{"m"}},
		{Name: "c", Address: "127.0.0.1:9003", Models: []string{"small"}}}
	cfg.Classify.Rules = []config.ClassifyRule{
		{Name: "secrets", PII: []string{"aws_access_key"}, Refuse: true},
		{Name: "stem", Regex: `\bintegral\b`, Workers: []string{"127.0.0.1:9002"}, Tag: true},
		{Name: "cheap", Regex: `(?i)^hello`, Model: "small"},
	}
	a, err := New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	chat := func(text string) string {
		return `{"model":"m","messages":[{"role":"user","content":"` + text + `"}]}`
	}
	rec, out := explain(t, a, "/debug/explain", chat("the integral of x"), nil)
	if rec.Code != http.StatusOK || out.Classify == nil {
		t.Fatalf("pool: %d %s", rec.Code, rec.Body)
	}
	if c := out.Classify; c.Rule != "stem" || c.Action != "workers" || len(c.Workers) != 1 || c.Tag != "rule=stem" {
		t.Fatalf("pool decision: %+v", c)
	}
	if len(out.Workers) != 1 || out.Workers[0].Worker != "b" || out.Chosen != "b" {
		t.Fatalf("pool pick: chosen %q among %+v, want b alone", out.Chosen, out.Workers)
	}

	_, out = explain(t, a, "/debug/explain", chat("hello there"), nil)
	if c := out.Classify; c == nil || c.Rule != "cheap" || c.Action != "model" || c.Model != "small" || out.Model != "small" || out.Chosen != "c" {
		t.Fatalf("rewrite: model %q chosen %q, %+v", out.Model, out.Chosen, out.Classify)
	}

	rec, out = explain(t, a, "/debug/explain", chat("AKIAIOSFODNN7EXAMPLE"), nil)
	if rec.Code != http.StatusOK || out.Classify == nil || !out.Classify.Refuse || out.Classify.Action != "refuse" || out.Chosen != "" || len(out.Workers) != 0 {
		t.Fatalf("refusal: %d %s", rec.Code, rec.Body)
	}
	var raw map[string]any
	json.Unmarshal(rec.Body.Bytes(), &raw)
	if raw["workers"] == nil {
		t.Errorf("a refusal's workers must be [], not null: %s", rec.Body)
	}

	_, out = explain(t, a, "/debug/explain", chat("nothing special"), nil)
	if c := out.Classify; c == nil || c.Rule != "" || c.Action != "none" || len(out.Workers) != 2 {
		t.Fatalf("no rule: %+v among %d workers", c, len(out.Workers))
	}
	if n := testutil.CollectAndCount(a.Metrics.Classify.Decisions); n != 0 {
		t.Fatalf("explain counted %d decision series, want none", n)
	}
}
