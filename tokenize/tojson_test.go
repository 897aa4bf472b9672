package tokenize

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"

	"github.com/kvroute/kvroute/internal/jsonvalue"
	"github.com/kvroute/kvroute/request"
)

// TestTojsonMatchesPython: tojson prints what Python's json.dumps prints for the
// object json.loads made of the request text (testdata/tojson_numbers.json, generated
// once with python3; see its generated_by): floats in repr form (1E3 → 1000.0,
// 1e-07, 1e+16), integers of any size exactly, key order as sent, Python's string
// escapes, and the indent / ensure_ascii / separators / sort_keys options. Before,
// the engine's tojson printed 0.0 as 0 and 1000.0 as 1000.
func TestTojsonMatchesPython(t *testing.T) {
	var table struct {
		Cases []struct {
			In            string `json:"in"`
			Dumps         string `json:"dumps"`
			Indent2       string `json:"indent2"`
			ASCII         string `json:"ascii"`
			SortedCompact string `json:"sorted_compact"`
		} `json:"cases"`
	}
	readJSON(t, filepath.Join("testdata", "tojson_numbers.json"), &table)
	if len(table.Cases) < 40 {
		t.Fatalf("only %d cases", len(table.Cases))
	}
	tmpl, err := compileChatTemplate(`{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ x|tojson(ensure_ascii=true) }}|{{ x | tojson(separators=(",", ":"), sort_keys=true) }}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range table.Cases {
		v, err := jsonvalue.ParseValue([]byte(c.In))
		if err != nil {
			t.Fatalf("%s: %v", c.In, err)
		}
		out, err := tmpl.tmpl.RenderValues(map[string]jinja.Value{"x": toJinja(v), tojsonFilter: tojsonValue})
		if err != nil {
			t.Fatalf("%s: %v", c.In, err)
		}
		want := c.Dumps + "|" + c.Indent2 + "|" + c.ASCII + "|" + c.SortedCompact
		if out != want {
			t.Errorf("%s:\n got %q\nwant %q", c.In, out, want)
		}
	}
}

// The Qwen3 template prints tool schemas with tojson: the numbers in the prompt are
// Python's, so the ids match the engine's.
func TestChatToolNumbersPythonForm(t *testing.T) {
	m := loadFamily(t, "qwen3")
	r, err := request.Parse(request.APIChat, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],
		"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{
			"t":{"type":"number","minimum":0.0,"maximum":1E3,"default":0.5,"multipleOf":1e-7,"big":12345678901234567890123}}}}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	text, err := m.RenderChat(r)
	if err != nil {
		t.Fatal(err)
	}
	want := `"minimum": 0.0, "maximum": 1000.0, "default": 0.5, "multipleOf": 1e-07, "big": 12345678901234567890123`
	if !strings.Contains(text, want) {
		t.Fatalf("render lacks %s:\n%s", want, text)
	}
}

func TestPyFloatRepr(t *testing.T) {
	tenth, fifth := 0.1, 0.2
	for f, want := range map[float64]string{1: "1.0", 1e16: "1e+16", 1e15: "1000000000000000.0", 1e-4: "0.0001",
		1e-5: "1e-05", tenth + fifth: "0.30000000000000004", -2.5: "-2.5", 1.5e300: "1.5e+300", 5e-324: "5e-324"} {
		if got := pyFloatRepr(f); got != want {
			t.Errorf("pyFloatRepr(%v) = %q, want %q", f, got, want)
		}
	}
}
