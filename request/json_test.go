package request

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/jsonvalue"
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
	v, err := jsonvalue.ParseValue([]byte(`{"b":1,"a":2,"b":3}`))
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
	v, err = jsonvalue.ParseValue([]byte(sb.String()))
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

// A body with invalid UTF-8 in a string is refused, as json.loads of the body bytes
// refuses it.
func TestParseInvalidUTF8(t *testing.T) {
	if _, err := Parse(APIChat, []byte("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}")); err == nil {
		t.Error("invalid UTF-8 accepted")
	}
}
