package jsonvalue

import (
	"encoding/json"
	"strings"
	"testing"
)

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
	if _, err := ParseValue([]byte("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}")); err == nil {
		t.Error("invalid UTF-8 accepted")
	}
}

// SniffString reads any top-level member of a possibly cut object with the full parse's
// rules (last wins, exact names); request.SniffModel is its "model" case.
func TestSniffStringKey(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string
		sure bool
	}{
		{`{"tenant":"a","Tenant":"x","tenant":"b"}`, "b", true},
		{`{"tenant":"a","model":"m"`, "a", false},
		{`{"tenant":"a","tenant":"cu`, "", false},
		{`{"tenant":1}`, "", true},
		{`["tenant","a"]`, "", false},
	} {
		got, sure := SniffString([]byte(c.in), "tenant")
		if got != c.want || sure != c.sure {
			t.Errorf("SniffString(%s) = %q, %v; want %q, %v", c.in, got, sure, c.want, c.sure)
		}
	}
}

// TestEscapedQuotesAndBackslashRuns: a string whose first '"' is escaped, with runs of
// backslashes before quotes, decodes as encoding/json decodes it (the buffer is sized
// from the real end of the string).
func TestEscapedQuotesAndBackslashRuns(t *testing.T) {
	for _, lit := range []string{`"\"a"`, `"a\\"`, `"\\\"b\\\\"`, `"x\"` + strings.Repeat(`y\\\"z`, 200) + `\\"`, `"\"\"\"\n\t\u00e9"`, `"\\\\\\\""`} {
		var want string
		if err := json.Unmarshal([]byte(lit), &want); err != nil {
			t.Fatalf("%s: %v", lit, err)
		}
		v, err := ParseValue([]byte(`{"k":` + lit + `,"after":1}`))
		if err != nil {
			t.Fatalf("%s: %v", lit, err)
		}
		if got := v.Field("k").Text(); got != want {
			t.Fatalf("%s: got %q want %q", lit, got, want)
		}
		if n, _ := v.Field("after").Int(); n != 1 {
			t.Fatalf("%s: the member after the string was lost", lit)
		}
	}
}
