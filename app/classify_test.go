package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/classify"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
)

// classify.rules from YAML reach the stage; a bad rule or an unreadable model fails
// start-up with the key and the rule named; no rules is the stage off.
func TestClassifyConfigAtStartup(t *testing.T) {
	dir := t.TempDir()
	yml := filepath.Join(dir, "kvroute.yaml")
	os.WriteFile(yml, []byte(`
classify:
  rules:
    - name: secrets
      pii: [aws_access_key, private_key]
      refuse: true
    - name: drafts
      regex: '(?i)\bdraft\b'
      over: both
      tag: true
`), 0o644)
	code, out, stderr := runMain("config", "--config", yml)
	if code != 0 || !strings.Contains(out, `"name":"secrets"`) || !strings.Contains(out, `"over":"both"`) {
		t.Fatalf("exit %d: %s\n%s", code, stderr, out)
	}

	cfg := config.Default()
	if rs, _, err := newClassify(&cfg, metrics.NewUnregistered(), nil); rs != nil || err != nil {
		t.Fatalf("no rules: %v %v, want the stage off", rs, err)
	}
	cfg.Classify.Rules = []config.ClassifyRule{{Name: "stem", Labels: []string{"math"}, Tag: true}}
	if _, _, err := newClassify(&cfg, metrics.NewUnregistered(), nil); err == nil || !strings.Contains(err.Error(), `"stem"`) {
		t.Fatalf("labels without a model: %v", err)
	}
	cfg.Classify.Model = filepath.Join(dir, "missing.kvr")
	if _, _, err := newClassify(&cfg, metrics.NewUnregistered(), nil); err == nil || !strings.Contains(err.Error(), "classify.model") {
		t.Fatalf("missing model: %v", err)
	}
	rows, err := classify.ReadRows("../classify/testdata/labelled.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	o := classify.DefaultTrainOptions()
	o.Features.Bits = 12
	m, err := classify.Train(rows, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Save(cfg.Classify.Model); err != nil {
		t.Fatal(err)
	}
	rs, watch, err := newClassify(&cfg, metrics.NewUnregistered(), nil)
	if err != nil || rs == nil || watch == nil {
		t.Fatalf("with a model: %v %v", err, watch)
	}
	if got := watch.Check(); got != "unchanged" {
		t.Fatalf("the model file just loaded: %s", got)
	}
	cfg.Classify.Rules[0].Class = "gold"
	if _, _, err := newClassify(&cfg, metrics.NewUnregistered(), nil); err == nil || !strings.Contains(err.Error(), "admission.classes") {
		t.Fatalf("unknown class: %v", err)
	}
	cfg.Classify.Rules = []config.ClassifyRule{{Name: "guard", RemoteLabels: []string{"jailbreak"}, RemoteFail: "closed", Refuse: true}}
	if _, _, err := newClassify(&cfg, metrics.NewUnregistered(), nil); err == nil || !strings.Contains(err.Error(), "classify.remote.url") {
		t.Fatalf("remote labels without a remote: %v", err)
	}
	cfg.Classify.Remote.URL, cfg.Classify.Remote.Model = "http://127.0.0.1:1/classify", "clf" // not called at start-up
	if rs, _, err := newClassify(&cfg, metrics.NewUnregistered(), nil); err != nil || rs == nil {
		t.Fatalf("with a remote: %v", err)
	}
}

// examples/kvroute-classify.yaml loads the committed example model and its rules compile
// against it (a label the model lacks would fail start-up).
func TestClassifyExampleConfig(t *testing.T) {
	t.Chdir("..") // the example's model path is relative to the repository root
	cfg, err := config.Load(nil, func(k string) (string, bool) {
		if k == "KVROUTE_CONFIG" {
			return "examples/kvroute-classify.yaml", true
		}
		return "", false
	})
	if err != nil {
		t.Fatal(err)
	}
	rs, _, err := newClassify(cfg, metrics.NewUnregistered(), nil)
	if err != nil || rs == nil {
		t.Fatalf("rules %v, %v", rs, err)
	}
}
