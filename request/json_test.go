package request

import (
	"encoding/json"
	"strings"
	"testing"
)

// Field names match exactly, as vLLM's pydantic models do: "MODEL", "Messages" and
// "STREAM" are unknown fields, not the routing fields (encoding/json matched them
// case-insensitively, so {"model":"m","MODEL":"other"} was routed as "other").
func TestParseFieldNamesExact(t *testing.T) {
	r, err := Parse(APIChat, []byte(`{"model":"m","MODEL":"other","Model":"x","STREAM":true,"Max_Tokens":-4,
		"messages":[{"role":"user","content":"hi"}],"Messages":"not an array"}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Model != "m" || r.Stream || r.MaxTokens != 0 || len(r.Messages) != 1 {
		t.Fatalf("case-folded field names were read: %+v", r)
	}
	if _, err := Parse(APIChat, []byte(`{"MODEL":"m","messages":[{"role":"user"}]}`)); err == nil {
		t.Fatal(`"MODEL" alone must not satisfy the required "model"`)
	}
	if _, err := Parse(APIChat, []byte(`{"model":"m","Messages":[{"role":"user"}]}`)); err == nil {
		t.Fatal(`"Messages" must not be taken for "messages"`)
	}
	// Inside messages too: "Role" is not "role".
	if _, err := Parse(APIChat, []byte(`{"model":"m","messages":[{"Role":"user"}]}`)); err == nil {
		t.Fatal(`"Role" must not be taken for "role"`)
	}
	if r, _ := Parse(APIOther, []byte(`{"MODEL":"e5"}`)); r.Model != "" {
		t.Fatalf("APIOther read %q from MODEL", r.Model)
	}
}

// A repeated key takes its last value everywhere (json.loads), and keeps the position
// of its first occurrence in an object.
func TestParseDuplicateKeysLastWins(t *testing.T) {
	r, err := Parse(APIChat, []byte(`{"model":"a","stream":true,"model":"b","stream":false,
		"messages":[{"role":"user","content":"first","content":"second"}],"max_tokens":3,"max_tokens":7}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Model != "b" || r.Stream || r.MaxTokens != 7 {
		t.Fatalf("not last-wins: %+v", r)
	}
	if c, _ := r.Messages[0].Field("content").Str(); c != "second" || r.Messages[0].Len() != 2 {
		t.Fatalf("message = %s", r.Messages[0].AppendJSON(nil))
	}
	v, err := ParseValue([]byte(`{"b":1,"a":2,"b":3}`))
	if err != nil || string(v.AppendJSON(nil)) != `{"b":3,"a":2}` {
		t.Fatalf("%s %v", v.AppendJSON(nil), err)
	}
	// A large object (map-indexed duplicate search) follows the same rule.
	var sb strings.Builder
	sb.WriteString("{")
	for i := range 100 {
		sb.WriteString(`"k` + strings.Repeat("x", i) + `":1,`)
	}
	sb.WriteString(`"k":2,"kx":3}`)
	v, err = ParseValue([]byte(sb.String()))
	if err != nil || v.Len() != 100 || v.Field("k").Text() != "2" || v.Field("kx").Text() != "3" || v.Members()[0].Key != "k" {
		t.Fatalf("large object: len %d k=%s kx=%s %v", v.Len(), v.Field("k").Text(), v.Field("kx").Text(), err)
	}
}

// The model sniffed from a cut body follows the full parse's rule: last wins. Before,
// the first "model" was returned, so {"model":"a","model":"b",… cut} went to "a".
func TestSniffModelDuplicates(t *testing.T) {
	for _, c := range []struct {
		body  string
		model string
		sure  bool
	}{
		{`{"model":"a","model":"b","messages":[{"role":"user","content":"lo`, "b", false},
		{`{"model":"a","messages":[],"model":"b"}`, "b", true},
		{`{"model":"a","messages":[],"model":"b`, "", false}, // the override is cut: unknown
		{`{"model":"a","messages":[],"mod`, "a", false},
		{`{"MODEL":"a","model":"b","Model":"c"}`, "b", true},
		{`{"model":"a"}`, "a", true},
		{`{"model":"a"`, "a", false},
		{`{}`, "", true},
	} {
		got, sure := SniffModel([]byte(c.body))
		if got != c.model || sure != c.sure {
			t.Errorf("SniffModel(%q) = %q, %v; want %q, %v", c.body, got, sure, c.model, c.sure)
		}
	}
}

// Values keep what chat templates need: key order, number literals, decoded strings.
func TestParseValueKeepsOrderAndNumbers(t *testing.T) {
	in := `{"z":1,"a":[1.0,1E3,-0,0.5,1e-7,12345678901234567890123,true,null],"m":{"y":"\u00e9\n\"","x":{}}}`
	v, err := ParseValue([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(v.AppendJSON(nil)); got != `{"z":1,"a":[1.0,1E3,-0,0.5,1e-7,12345678901234567890123,true,null],"m":{"y":"é\n\"","x":{}}}` {
		t.Fatalf("round trip %s", got)
	}
	a := v.Field("a")
	if !a.Index(2).IsInt() || a.Index(0).IsInt() || a.Index(1).IsInt() {
		t.Fatal("int vs float lost")
	}
	if _, ok := a.Index(5).Int(); ok {
		t.Fatal("a 23-digit integer does not fit int64")
	}
	if s, _ := v.Field("m").Field("y").Str(); s != "é\n\"" {
		t.Fatalf("escapes: %q", s)
	}
	// Agrees with encoding/json on what it accepts and on string contents.
	for _, s := range []string{`"\ud83d\ude00"`, `"\ud800"`, `"a\/b\u0041"`, `"tab\there"`, `""`, `"ünï\u00e7ødé"`} {
		var want string
		if err := json.Unmarshal([]byte(s), &want); err != nil {
			t.Fatal(err)
		}
		got, err := ParseValue([]byte(s))
		if err != nil || got.Text() != want {
			t.Errorf("%s: %q %v, want %q", s, got.Text(), err, want)
		}
	}
}

// Malformed JSON is a *SyntaxError with an offset, never a panic, at every cut of a
// valid body and for each kind of mistake; invalid UTF-8 is refused as json.loads of the
// body bytes refuses it.
func TestParseValueErrors(t *testing.T) {
	good := `{"a":[1,-2.5e+3,"x\n\u00e9",true,false,null,{"b":{}}],"c":"ünï"}`
	if _, err := ParseValue([]byte(good)); err != nil {
		t.Fatal(err)
	}
	for i := range len(good) {
		if _, err := ParseValue([]byte(good[:i])); err == nil {
			t.Errorf("cut at %d accepted", i)
		}
	}
	for _, bad := range []string{`{"a":01}`, `{"a":1.}`, `{"a":.5}`, `{"a":1e}`, `{"a":-}`, `{"a":tru}`, `{"a" 1}`,
		`{"a":1,}`, `[1,]`, `{"a":"\x01"}`, `{"a":"\q"}`, `{"a":"\u12g4"}`, `{a:1}`, `{"a":1} x`, "\"\xff\"", "\"a\xc3\"",
		`{"a":NaN}`, `{"a":Infinity}`, `'a'`} {
		_, err := ParseValue([]byte(bad))
		se, ok := err.(*SyntaxError)
		if !ok || se.Offset <= 0 || se.Msg == "" {
			t.Errorf("%q: %v, want a *SyntaxError", bad, err)
		}
		if json.Valid([]byte(bad)) && !strings.ContainsAny(bad, "\xff\xc3") {
			t.Errorf("%q: encoding/json accepts it", bad)
		}
	}
	deep := strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1)
	if _, err := ParseValue([]byte(deep)); err == nil {
		t.Error("nesting past MaxDepth accepted")
	}
	if _, err := Parse(APIChat, []byte("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}")); err == nil {
		t.Error("invalid UTF-8 accepted")
	}
}
