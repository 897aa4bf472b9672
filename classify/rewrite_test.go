package classify

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/metrics"
)

// A model rule rewrites the body and the request's model where the front may replace
// the body, and is skipped (model kept, body as sent) where it may not; both counted.
func TestRewriteModel(t *testing.T) {
	rs, err := Compile([]RuleSpec{{Name: "cheap", Regex: `(?i)^hello`, Model: "small", Tag: true}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ms := metrics.NewUnregistered()
	rs.Count(ms.Classify)
	const body = `{"model":"big","messages":[{"role":"user","content":"Hello there"}],"stream":true}`
	req := chat(t, body)
	d := rs.Decide(Input{Req: req})
	if d.Rule != "cheap" || d.Model != "small" || d.Action() != "model" {
		t.Fatalf("decision %+v", d)
	}
	out, ok := rs.Rewrite(d, req, []byte(body), true, 0)
	want := `{"model":"small","messages":[{"role":"user","content":"Hello there"}],"stream":true}`
	if !ok || string(out) != want || req.Model != "small" {
		t.Fatalf("rewrite: %s %v model %q, want %s", out, ok, req.Model, want)
	}
	req = chat(t, body)
	out, ok = rs.Rewrite(d, req, []byte(body), false, 0)
	if ok || string(out) != body || req.Model != "big" {
		t.Fatalf("immutable body: %s %v model %q, want the body and model as sent", out, ok, req.Model)
	}
	if d := rs.Decide(Input{Req: chat(t, `{"model":"big","messages":[{"role":"user","content":"bye"}]}`)}); d.Model != "" {
		t.Fatalf("no match: %+v", d)
	}
	if out, ok := rs.Rewrite(Decision{}, req, []byte(body), true, 0); ok || string(out) != body {
		t.Fatalf("no rewrite asked: %s %v", out, ok)
	}
	for outcome, n := range map[string]float64{"applied": 1, "skipped": 1} {
		if v := testutil.ToFloat64(ms.Classify.Rewrites.WithLabelValues("cheap", outcome)); v != n {
			t.Errorf("rewrites{outcome=%s} = %v, want %v", outcome, v, n)
		}
	}
	if v := testutil.ToFloat64(ms.Classify.Decisions.WithLabelValues("cheap", "none", "model")); v != 1 {
		t.Errorf("decisions{action=model} = %v, want 1", v)
	}
}
