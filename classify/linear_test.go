package classify

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testdata/labelled.jsonl holds 80 MMLU-Pro questions (TIGER-Lab/MMLU-Pro, MIT licence),
// 20 from each of math, computer science, history and law.
const fixture = "testdata/labelled.jsonl"

func smallOptions() TrainOptions {
	o := DefaultTrainOptions()
	o.Features.Bits = 16
	return o
}

func TestFeaturesFoldCaseAndDigits(t *testing.T) {
	f := DefaultFeatures()
	a := f.Append(nil, "Integral of X from 3 to 14")
	b := f.Append(nil, "integral of x FROM 7 to 99")
	if len(a) != len(b) {
		t.Fatalf("len %d vs %d", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("feature %d differs: %d vs %d", i, a[i], b[i])
		}
	}
	if c := f.Append(nil, "derivative of x from 7 to 99"); c[0] == a[0] {
		t.Fatalf("different first words share a feature")
	}
	for _, x := range a {
		if x >= 1<<f.Bits {
			t.Fatalf("index %d outside 2^%d", x, f.Bits)
		}
	}
}

func TestFeaturesWindowBoundsWork(t *testing.T) {
	f := DefaultFeatures()
	f.WindowBytes = 100
	long := strings.Repeat("word ", 1000)
	if got, want := len(f.Append(nil, long)), len(f.Append(nil, long[:100])); got != want {
		t.Fatalf("windowed features %d, want %d (the first 100 bytes)", got, want)
	}
}

func TestTrainIsDeterministicAndFits(t *testing.T) {
	rows, err := ReadRows(fixture)
	if err != nil {
		t.Fatal(err)
	}
	m1, err := Train(rows, smallOptions())
	if err != nil {
		t.Fatal(err)
	}
	m2, _ := Train(rows, smallOptions())
	for i := range m1.W {
		if m1.W[i] != m2.W[i] {
			t.Fatalf("weight %d differs between two trainings: %g vs %g", i, m1.W[i], m2.W[i])
		}
	}
	if got := strings.Join(m1.Labels, ","); got != "computer science,history,law,math" {
		t.Fatalf("labels %q", got)
	}
	rep := Evaluate(m1, rows)
	if rep.Accuracy < 0.95 {
		t.Fatalf("training accuracy %.3f, want ≥ 0.95 (the model does not fit its own rows)", rep.Accuracy)
	}
	p := m1.PredictAll(rows[0].Text)
	if p.Label != rows[0].Label || len(p.Probs) != 4 {
		t.Fatalf("row 0 (%s) classified %q (%v)", rows[0].Label, p.Label, p.Probs)
	}
	var sum float64
	for _, q := range p.Probs {
		sum += q
	}
	if sum < 0.999 || sum > 1.001 || p.Confidence <= 0.25 {
		t.Fatalf("probabilities sum %g, confidence %g", sum, p.Confidence)
	}
	if q := m1.Predict(p.Label); q.Confidence <= 0 || q.Confidence > 1 {
		t.Fatalf("confidence %g outside (0, 1]", q.Confidence)
	}
}

func TestSaveLoadKeepsPredictions(t *testing.T) {
	rows, _ := ReadRows(fixture)
	m, err := Train(rows, smallOptions())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "m.kvr")
	if err := m.Save(path); err != nil {
		t.Fatal(err)
	}
	l, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if l.Features != m.Features || strings.Join(l.Labels, ",") != strings.Join(m.Labels, ",") {
		t.Fatalf("header changed: %+v %v", l.Features, l.Labels)
	}
	same := 0
	for _, r := range rows {
		if m.Predict(r.Text).Label == l.Predict(r.Text).Label {
			same++
		}
	}
	if same < len(rows)-1 {
		t.Fatalf("quantized model agrees on %d of %d rows", same, len(rows))
	}
}

func TestLoadRejectsOtherFiles(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	os.WriteFile(plain, []byte("not a model"), 0o644)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write([]byte(modelMagic + "\xff\xff\xff\xff"))
	zw.Close()
	huge := filepath.Join(dir, "huge")
	os.WriteFile(huge, buf.Bytes(), 0o644)
	buf.Reset()
	zw = gzip.NewWriter(&buf)
	zw.Write([]byte("KVRLIN9\n"))
	zw.Close()
	other := filepath.Join(dir, "other")
	os.WriteFile(other, buf.Bytes(), 0o644)
	for _, p := range []string{plain, huge, other} {
		if _, err := Load(p); !errors.Is(err, ErrModelFormat) {
			t.Errorf("%s: err %v, want ErrModelFormat", filepath.Base(p), err)
		}
	}
	if _, err := Load(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

func TestReadRowsNamesTheBadLine(t *testing.T) {
	dir := t.TempDir()
	cases := map[string]string{
		"notjson":  `{"text":"a","label":"x"}` + "\n" + `{oops` + "\n",
		"nolabel":  `{"text":"a","label":"x"}` + "\n\n" + `{"text":"b"}` + "\n",
		"toolong":  `{"text":"a","label":"x"}` + "\n" + `{"text":"` + strings.Repeat("a", MaxRowBytes) + `","label":"y"}` + "\n",
		"empty":    "\n\n",
		"missing/": "",
	}
	want := map[string]string{"notjson": ":2:", "nolabel": ":3:", "toolong": "after line 1", "empty": "no rows", "missing/": "no such file"}
	for name, body := range cases {
		p := filepath.Join(dir, name)
		if body != "" || name == "empty" {
			os.WriteFile(p, []byte(body), 0o644)
		}
		_, err := ReadRows(p)
		if err == nil || !strings.Contains(err.Error(), want[name]) {
			t.Errorf("%s: err %v, want one containing %q", name, err, want[name])
		}
	}
}

func TestReadRowsGzip(t *testing.T) {
	raw, _ := os.ReadFile(fixture)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(raw)
	zw.Close()
	p := filepath.Join(t.TempDir(), "rows.jsonl.gz")
	os.WriteFile(p, buf.Bytes(), 0o644)
	rows, err := ReadRows(p)
	if err != nil || len(rows) != 80 {
		t.Fatalf("%d rows, %v", len(rows), err)
	}
}

func TestTrainRejectsBadInput(t *testing.T) {
	one := []Row{{Text: "a", Label: "x"}, {Text: "b", Label: "x"}}
	if _, err := Train(one, smallOptions()); err == nil {
		t.Error("one label trained")
	}
	if _, err := Train(nil, smallOptions()); err == nil {
		t.Error("no rows trained")
	}
	o := smallOptions()
	o.Features.Bits = 30
	if _, err := Train([]Row{{"a", "x"}, {"b", "y"}}, o); err == nil {
		t.Error("30 feature bits accepted")
	}
}

func TestScoreMacroF1(t *testing.T) {
	rep := Score([]string{"a", "a", "b", "b"}, []string{"a", "b", "b", "b"})
	if rep.Accuracy != 0.75 {
		t.Fatalf("accuracy %g", rep.Accuracy)
	}
	// a: P 1, R 0.5, F1 0.667; b: P 0.667, R 1, F1 0.8; macro 0.733.
	if rep.MacroF1 != 0.733 || rep.PerClass["a"].F1 != 0.667 || rep.PerClass["b"].Support != 2 {
		t.Fatalf("%+v", rep)
	}
}

func TestCommandTrainEval(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "m.kvr")
	var out, errb bytes.Buffer
	if code := Command([]string{"train", "--data", fixture, "--out", model, "--bits", "16", "--folds", "4"}, &out, &errb); code != 0 {
		t.Fatalf("train: %d %s", code, errb.String())
	}
	var tr TrainReport
	if err := json.Unmarshal(out.Bytes(), &tr); err != nil {
		t.Fatalf("train output %q: %v", out.String(), err)
	}
	if tr.Rows != 80 || len(tr.CV) != 4 || tr.CVAccuracy <= 0.25 || tr.Out != model {
		t.Fatalf("train report %+v", tr)
	}
	out.Reset()
	if code := Command([]string{"eval", "--model", model, "--data", fixture}, &out, &errb); code != 0 {
		t.Fatalf("eval: %d %s", code, errb.String())
	}
	var rep map[string]any
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"accuracy", "macro_f1", "per_class", "p99_us"} {
		if _, ok := rep[k]; !ok {
			t.Errorf("eval output lacks %q: %s", k, out.String())
		}
	}
	if rep["accuracy"].(float64) < 0.95 {
		t.Errorf("accuracy on training rows %v", rep["accuracy"])
	}
	for _, args := range [][]string{
		{"train", "--out", model},
		{"train", "--data", fixture},
		{"train", "--data", fixture, "--folds", "1"},
		{"eval", "--model", model},
		{"nosuch"},
		{},
		{"train", "--data", fixture, "--out", model, "--bits", "40"},
	} {
		if code := Command(args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	if code := Command([]string{"eval", "--model", fixture, "--data", fixture}, &out, &errb); code != 1 {
		t.Errorf("eval with a non-model: exit %d, want 1", code)
	}
}

// A damaged row table is refused with ErrModelFormat, and MaxRows keeps the rows of
// largest weight and a model that still reads its training rows.
func TestModelRowsPrunedAndChecked(t *testing.T) {
	rows, _ := ReadRows(fixture)
	o := smallOptions()
	full, err := Train(rows, o)
	if err != nil {
		t.Fatal(err)
	}
	o.MaxRows = len(full.Buckets) / 4
	small, err := Train(rows, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(small.Buckets) != o.MaxRows || len(small.W) != o.MaxRows*len(small.Labels) || len(small.IDF) != o.MaxRows {
		t.Fatalf("pruned model has %d rows, %d weights, %d idf; want %d rows", len(small.Buckets), len(small.W), len(small.IDF), o.MaxRows)
	}
	for i := 1; i < len(small.Buckets); i++ {
		if small.Buckets[i] <= small.Buckets[i-1] {
			t.Fatalf("rows out of order at %d", i)
		}
	}
	if rep := Evaluate(small, rows); rep.Accuracy < 0.9 {
		t.Fatalf("a quarter of the rows reads its training rows at %.3f", rep.Accuracy)
	}
	// a bucket outside the feature space, and a file cut short in its weights.
	bad := *small
	bad.Buckets = append([]uint32(nil), small.Buckets...)
	bad.Buckets[len(bad.Buckets)-1] = 1 << 20
	var buf bytes.Buffer
	if err := bad.write(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := read(&buf); !errors.Is(err, ErrModelFormat) || !strings.Contains(err.Error(), "bucket") {
		t.Errorf("bucket outside 2^16: %v", err)
	}
	buf.Reset()
	small.write(&buf)
	raw, _ := gzip.NewReader(bytes.NewReader(buf.Bytes()))
	var plain bytes.Buffer
	plain.ReadFrom(raw)
	var cut bytes.Buffer
	zw := gzip.NewWriter(&cut)
	zw.Write(plain.Bytes()[:plain.Len()-len(small.B)*4-10])
	zw.Close()
	if _, err := read(&cut); !errors.Is(err, ErrModelFormat) {
		t.Errorf("truncated file: %v", err)
	}
}

// The committed example model (make classify-example) loads and reads a subject.
func TestExampleModel(t *testing.T) {
	m, err := Load(exampleModelPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Labels) != 14 {
		t.Fatalf("%d labels: %v", len(m.Labels), m.Labels)
	}
	for text, want := range map[string]string{
		"Find the derivative of f(x) = x^3 + 2x with respect to x and evaluate the integral of f from 0 to 1.":   "math",
		"Under the Fourth Amendment, is evidence from a warrantless search admissible at the defendant's trial?": "law",
	} {
		if p := m.Predict(text); p.Label != want {
			t.Errorf("%q read as %s (%.2f), want %s", text, p.Label, p.Confidence, want)
		}
	}
}
