package classify

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/metrics"
)

// Rules on remote labels against a loopback double of vLLM's POST /classify: a label
// rule matches on the remote's answer (one call per text, a repeat answered by the
// cache with no call), the tag names the remote label; when the remote fails, a
// fail-open rule does not match and a fail-closed one decides Unavailable; every answer
// is counted by outcome.
func TestDecideOnRemoteLabels(t *testing.T) {
	d := newClassifyDouble(t)
	remote, err := NewRemote(RemoteOptions{URL: d.srv.URL + "/classify", Model: "clf", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ms := metrics.NewUnregistered()
	remote.Count(ms.Classify)
	rs, err := CompileWith([]RuleSpec{
		{Name: "guard", Regex: `(?i)\bpayroll\b`, RemoteLabels: []string{"math"}, RemoteFail: "closed", Refuse: true},
		{Name: "stem", RemoteLabels: []string{"math"}, MinConfidence: 0.8, Workers: []string{"10.0.0.3:8000"}, Tag: true},
	}, Classifiers{Remote: remote}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rs.Count(ms.Classify)
	ask := func(text string) Decision {
		return rs.Decide(Input{Req: chat(t, `{"model":"m","messages":[{"role":"user","content":"`+text+`"}]}`)})
	}
	for i := 0; i < 3; i++ {
		dec := ask("the integral of x")
		if dec.Rule != "stem" || dec.RemoteLabel != "math" || dec.RemoteConfidence != 0.9 || len(dec.Workers) != 1 ||
			len(dec.Header) != 1 || dec.Header[0][1] != "rule=stem; remote_label=math" {
			t.Fatalf("ask %d: %+v", i, dec)
		}
	}
	if n := d.calls.Load(); n != 1 {
		t.Fatalf("%d calls for one text asked three times, want 1 (the cache)", n)
	}
	if dec := ask("hello"); dec.Rule != "" || dec.RemoteLabel != "other" || dec.Action() != "none" {
		t.Fatalf("other: %+v", dec)
	}
	d.mode.Store("500")
	if dec := ask("another integral"); dec.Rule != "" || dec.RemoteLabel != "" {
		t.Fatalf("remote down, fail open: %+v", dec)
	}
	dec := ask("the payroll integral")
	if dec.Rule != "guard" || !dec.Unavailable || dec.Refuse || dec.Action() != "unavailable" {
		t.Fatalf("remote down, fail closed: %+v", dec)
	}
	if n := d.calls.Load(); n != 4 {
		t.Fatalf("%d calls, want 4 (a failure is not cached; one call per text per request)", n)
	}
	for outcome, n := range map[string]float64{"ok": 2, "cached": 2, "error": 2, "timeout": 0} {
		if v := testutil.ToFloat64(ms.Classify.RemoteRequests.WithLabelValues(outcome)); v != n {
			t.Errorf("remote_requests{outcome=%s} = %v, want %v", outcome, v, n)
		}
	}
	if v := testutil.ToFloat64(ms.Classify.Decisions.WithLabelValues("guard", "none", "unavailable")); v != 1 {
		t.Errorf("decisions{guard,unavailable} = %v, want 1", v)
	}

	short, _ := NewRemote(RemoteOptions{URL: d.srv.URL + "/classify", Model: "clf", Timeout: 10 * time.Millisecond})
	short.Count(ms.Classify)
	rs2, err := CompileWith([]RuleSpec{{Name: "stem", RemoteLabels: []string{"math"}, Tag: true}}, Classifiers{Remote: short}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d.mode.Store("block")
	if dec := rs2.Decide(Input{Req: chat(t, `{"model":"m","messages":[{"role":"user","content":"slow integral"}]}`)}); dec.Rule != "" {
		t.Fatalf("timed out, fail open: %+v", dec)
	}
	if v := testutil.ToFloat64(ms.Classify.RemoteRequests.WithLabelValues("timeout")); v != 1 {
		t.Errorf("remote_requests{timeout} = %v, want 1", v)
	}
}

func TestCompileRemoteRules(t *testing.T) {
	d := newClassifyDouble(t)
	remote, _ := NewRemote(RemoteOptions{URL: d.srv.URL + "/classify", Model: "clf"})
	for want, spec := range map[string]RuleSpec{
		"remote_labels need classify.remote.url": {Name: "a", RemoteLabels: []string{"x"}, Tag: true},
		"remote_fail needs remote_labels":        {Name: "a", Regex: "x", RemoteFail: "closed", Tag: true},
		`remote_fail "shut"`:                     {Name: "a", RemoteLabels: []string{"x"}, RemoteFail: "shut", Tag: true},
	} {
		c := Classifiers{Remote: remote}
		if strings.Contains(want, "classify.remote.url") {
			c.Remote = nil
		}
		if _, err := CompileWith([]RuleSpec{spec}, c, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v, want %q", spec, err, want)
		}
	}
	if _, err := CompileWith([]RuleSpec{{Name: "a", RemoteLabels: []string{"x"}, RemoteFail: "open", Tag: true}}, Classifiers{Remote: remote}, nil); err != nil {
		t.Errorf("a remote rule alone is a match field: %v", err)
	}
}
