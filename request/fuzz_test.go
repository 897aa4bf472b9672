package request

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"

	"github.com/kvroute/kvroute/internal/jsonvalue"
)

// fuzzSeeds are request bodies of every API from the package's tests and, when
// present, the chat corpus of the tokenizer goldens.
func fuzzSeeds(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":5,"max_completion_tokens":9,
		  "add_generation_prompt":false,"continue_final_message":true,"chat_template_kwargs":{"enable_thinking":false},
		  "reasoning_effort":"low","cache_salt":"s1","tools":[{"type":"function","function":{"name":"f","parameters":{"a":1.0}}}],
		  "messages":[{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":null,"tool_calls":[]}]}`,
		`{"model":"m","prompt":[[1,2],[3]]}`, `{"model":"m","prompt":["a","b"]}`, `{"model":"m","prompt":"once"}`,
		`{"model":"m","max_tokens":64,"system":[{"type":"text","text":"sys"}],"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"a","model":"b","MODEL":"c","messages":[{"role":"user","content":"x\u00e9\ud83d\ude00"}]}`,
		`"a\nb\"c\\d\u00e9\ud83d\ude00\ud800x\udc00\/\b\f\r\t 01234567890123456789"`, `"\ud83dx"`,
		`{"model":`, `[1,2]`, `{"a":01}`, "\"\xff\"", `{"a":[[[[[]]]]],"b":{"c":{"d":-0.0e+1}}}`,
	} {
		f.Add(byte(0), []byte(s))
	}
	b, err := os.ReadFile(filepath.Join("..", "tokenize", "testdata", "corpus.json"))
	if err != nil {
		return
	}
	var corpus struct {
		Chats []struct {
			Request json.RawMessage `json:"request"`
		} `json:"chats"`
	}
	if json.Unmarshal(b, &corpus) == nil {
		for _, c := range corpus.Chats {
			f.Add(byte(0), []byte(c.Request))
		}
	}
}

// FuzzParse: no body panics any API's parser, parsing is deterministic, ParseValue
// accepts exactly the valid UTF-8 JSON that encoding/json accepts, its output re-parses
// to itself, and the model sniffed from a whole object is the one Parse reads.
func FuzzParse(f *testing.F) {
	fuzzSeeds(f)
	apis := []API{APIChat, APICompletions, APIMessages, APIOther}
	f.Fuzz(func(t *testing.T, which byte, body []byte) {
		api := apis[int(which)%len(apis)]
		r1, err1 := Parse(api, body)
		r2, err2 := Parse(api, bytes.Clone(body))
		if (err1 == nil) != (err2 == nil) || (err1 != nil && err1.Error() != err2.Error()) {
			t.Fatalf("not deterministic: %v / %v", err1, err2)
		}
		if err1 == nil && (r1.Model != r2.Model || len(r1.Messages) != len(r2.Messages)) {
			t.Fatal("not deterministic")
		}
		if err1 != nil {
			if _, ok := AsError(err1); !ok {
				t.Fatalf("error %v is not *Error", err1)
			}
		}
		v, err := jsonvalue.ParseValue(body)
		valid := json.Valid(body) && utf8.Valid(body)
		if (err == nil) != valid {
			t.Fatalf("ParseValue err %v, encoding/json+utf8 valid %v", err, valid)
		}
		if err != nil {
			for i := 0; i <= len(body); i += 1 + len(body)/16 {
				SniffModel(body[:i])
			}
			return
		}
		if v.Kind() == jsonvalue.String {
			var want string
			if json.Unmarshal(body, &want) != nil || v.Text() != want {
				t.Fatalf("string %q decodes to %q, encoding/json: %q", body, v.Text(), want)
			}
		}
		out := v.AppendJSON(nil)
		v2, err := jsonvalue.ParseValue(out)
		if err != nil || !bytes.Equal(v2.AppendJSON(nil), out) {
			t.Fatalf("re-parse of %q: %v", out, err)
		}
		if v.Kind() == jsonvalue.Object {
			want, _ := v.Field("model").Str()
			if got, sure := SniffModel(body); got != want || !sure {
				t.Fatalf("SniffModel = %q, %v; Parse reads %q", got, sure, want)
			}
		}
	})
}
