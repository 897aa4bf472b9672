package classify

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/metrics"
)

// The model file rewritten under a running stage: a model with the math and law labels
// swapped is in use from the next decision; a corrupt file and one without a label a rule
// matches on leave the model in use, and are not read again until they change; each
// reload is counted by outcome.
func TestModelWatcherReloads(t *testing.T) {
	rows, err := ReadRows(fixture)
	if err != nil {
		t.Fatal(err)
	}
	train := func(relabel func(string) string) *Linear {
		rs := make([]Row, 0, len(rows))
		for _, r := range rows {
			if l := relabel(r.Label); l != "" {
				rs = append(rs, Row{Text: r.Text, Label: l})
			}
		}
		m, err := Train(rs, smallOptions())
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	path := filepath.Join(t.TempDir(), "model.kvr")
	stamp := time.Unix(1_700_000_000, 0)
	write := func(save func(string) error) {
		t.Helper()
		if err := save(path); err != nil {
			t.Fatal(err)
		}
		stamp = stamp.Add(time.Minute) // a distinct modification time, whatever the clock's resolution
		if err := os.Chtimes(path, stamp, stamp); err != nil {
			t.Fatal(err)
		}
	}
	write(train(func(l string) string { return l }).Save)

	ms := metrics.NewUnregistered()
	model, w, err := LoadWatched(path, ms.Classify, nil)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Compile([]RuleSpec{{Name: "stem", Labels: []string{"math"}, Tag: true}}, model, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.Watch(rs)
	var mathQ string
	for _, r := range rows {
		if r.Label == "math" {
			mathQ = r.Text
			break
		}
	}
	decide := func() Decision {
		return rs.Decide(Input{Req: chat(t, `{"model":"m","messages":[{"role":"user","content":`+quote(mathQ)+`}]}`)})
	}
	if d := decide(); d.Rule != "stem" || d.Label != "math" {
		t.Fatalf("first model: %+v", d)
	}
	if got := w.Check(); got != "unchanged" {
		t.Fatalf("untouched file: %s", got)
	}

	swapped := train(func(l string) string {
		switch l {
		case "math":
			return "law"
		case "law":
			return "math"
		}
		return l
	})
	write(swapped.Save)
	if got := w.Check(); got != "ok" {
		t.Fatalf("rewritten file: %s", got)
	}
	if d := decide(); d.Rule != "" || d.Label != "law" {
		t.Fatalf("after the reload: %+v, want the swapped model's label law and no match", d)
	}

	write(func(p string) error { return os.WriteFile(p, []byte("not a model"), 0o644) })
	if got := w.Check(); got != "error" {
		t.Fatalf("corrupt file: %s", got)
	}
	if got := w.Check(); got != "unchanged" {
		t.Fatalf("the same corrupt file again: %s, want it not read again", got)
	}
	if decide().Label != "law" {
		t.Fatal("a corrupt file replaced the model in use")
	}

	write(train(func(l string) string {
		if l == "math" {
			return ""
		}
		return l
	}).Save)
	if got := w.Check(); got != "rejected" {
		t.Fatalf("a model without math: %s", got)
	}
	if d := decide(); d.Label != "law" {
		t.Fatalf("a rejected model replaced the model in use: %+v", d)
	}
	for outcome, n := range map[string]float64{"ok": 1, "error": 1, "rejected": 1} {
		if v := testutil.ToFloat64(ms.Classify.ModelReloads.WithLabelValues(outcome)); v != n {
			t.Errorf("model_reloads{outcome=%s} = %v, want %v", outcome, v, n)
		}
	}
}
