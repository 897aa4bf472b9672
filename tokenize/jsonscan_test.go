package tokenize

import (
	"errors"
	"testing"
)

func TestScanVocab(t *testing.T) {
	got := map[string]uint32{}
	err := scanVocab([]byte(` { "a" : 1, "\"q\u00e9\ud83d\ude00" :2,"Ġb":3 } `), func(tok string, id uint32) { got[tok] = id })
	if err != nil || len(got) != 3 || got["\"qé😀"] != 2 || got["Ġb"] != 3 {
		t.Fatalf("scanVocab = %v, %v (escapes must decode as JSON does, surrogate pairs included)", got, err)
	}
	for _, bad := range []string{`[]`, `{"a":}`, `{"a":1`, `{"a" 1}`, `{"a":99999999999}`, `{"a":1,}`} {
		if err := scanVocab([]byte(bad), func(string, uint32) {}); err == nil {
			t.Errorf("scanVocab(%s) accepted malformed input", bad)
		}
	}
}

func TestScanMerges(t *testing.T) {
	for _, in := range []string{`["a b", "ab c"]`, `[["a","b"], [ "ab" , "c" ]]`} {
		var got [][2]string
		err := scanMerges([]byte(in), func(a, c string) error { got = append(got, [2]string{a, c}); return nil })
		if err != nil || len(got) != 2 || got[1] != [2]string{"ab", "c"} {
			t.Errorf("scanMerges(%s) = %v, %v", in, got, err)
		}
	}
	for _, bad := range []string{`{}`, `["ab"]`, `[["a"]]`, `[["a","b","c"]]`, `[1]`, `["a b"`} {
		if err := scanMerges([]byte(bad), func(string, string) error { return nil }); err == nil {
			t.Errorf("scanMerges(%s) accepted malformed input", bad)
		}
	}
	stop := errors.New("stop")
	if err := scanMerges([]byte(`["a b"]`), func(string, string) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("callback error not returned: %v", err)
	}
}
