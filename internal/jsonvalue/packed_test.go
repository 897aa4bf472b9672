package jsonvalue

import (
	"strings"
	"testing"
)

// parseTree parses with packed arrays off: the form every array had before.
func parseTree(data []byte, maxElems int) (Value, error) {
	return parse(parser{b: data, maxElems: maxElems, tree: true})
}

// samePacked fails t unless parsing data packed and as a tree (with bound maxElems)
// gives the same error, or Values that agree on every method.
func samePacked(t *testing.T, data []byte, maxElems int) Value {
	t.Helper()
	got, err := ParseValueLimit(data, maxElems)
	want, werr := parseTree(data, maxElems)
	if (err == nil) != (werr == nil) || (err != nil && (err.Error() != werr.Error() || errOffset(err) != errOffset(werr))) {
		t.Fatalf("%.80q (bound %d): packed %v, tree %v", data, maxElems, err, werr)
	}
	if err == nil {
		sameValue(t, got, want)
	}
	return got
}

func errOffset(err error) int64 {
	switch e := err.(type) {
	case *SyntaxError:
		return e.Offset
	case *LimitError:
		return e.Offset
	}
	return -1
}

func sameValue(t *testing.T, got, want Value) {
	t.Helper()
	if g, w := string(got.AppendJSON(nil)), string(want.AppendJSON(nil)); g != w {
		t.Fatalf("AppendJSON %.80s, tree %.80s", g, w)
	}
	if got.Kind() != want.Kind() || got.Len() != want.Len() || got.Text() != want.Text() || got.IsInt() != want.IsInt() {
		t.Fatalf("%.80s: kind %v/%v len %d/%d text %q/%q", want.AppendJSON(nil), got.Kind(), want.Kind(), got.Len(), want.Len(), got.Text(), want.Text())
	}
	gi, gok := got.Int()
	wi, wok := want.Int()
	if gi != wi || gok != wok || len(got.Members()) != len(want.Members()) {
		t.Fatalf("%.80s: Int or Members differ", want.AppendJSON(nil))
	}
	for i, m := range want.Members() {
		if got.Members()[i].Key != m.Key {
			t.Fatalf("member %d key %q, tree %q", i, got.Members()[i].Key, m.Key)
		}
	}
	for i := range want.Len() {
		sameValue(t, got.Index(i), want.Index(i))
	}
}

// An array of plain uint32 integers is stored packed (Uint32s) and reads, writes and
// errs exactly as the tree of Numbers it replaces; any other array (a sign, a fraction,
// an exponent, a value past uint32, another type) stays a tree; bounds and malformed
// arrays give the tree's error at the tree's offset.
func TestPackedArrays(t *testing.T) {
	for _, c := range []struct {
		in   string
		ids  []uint32 // nil: not packed
		errs bool
	}{
		{in: `[0]`, ids: []uint32{0}},
		{in: `[ 1 ,2,	3
]`, ids: []uint32{1, 2, 3}},
		{in: `[4294967295,0,151000]`, ids: []uint32{4294967295, 0, 151000}},
		{in: `[]`},
		{in: `[4294967296]`},
		{in: `[99999999999999999999999]`},
		{in: `[1,-1]`},
		{in: `[1,1.0]`},
		{in: `[1,1e3]`},
		{in: `[1,2E1]`},
		{in: `[1,"2"]`},
		{in: `[1,[2]]`},
		{in: `[1,null]`},
		{in: `[-0]`},
		{in: `[01]`, errs: true},
		{in: `[1,01]`, errs: true},
		{in: `[1,,2]`, errs: true},
		{in: `[1 2]`, errs: true},
		{in: `[1,]`, errs: true},
		{in: `[1,2`, errs: true},
		{in: `[1,2,`, errs: true},
		{in: `[1.]`, errs: true},
		{in: `[1e]`, errs: true},
	} {
		v := samePacked(t, []byte(c.in), 0)
		_, err := ParseValue([]byte(c.in))
		if (err != nil) != c.errs {
			t.Errorf("%s: error %v, want error %v", c.in, err, c.errs)
			continue
		}
		ids, ok := v.Uint32s()
		if ok != (c.ids != nil) || len(ids) != len(c.ids) {
			t.Errorf("%s: Uint32s %v %v, want %v", c.in, ids, ok, c.ids)
			continue
		}
		for i := range ids {
			if ids[i] != c.ids[i] {
				t.Errorf("%s: id %d = %d, want %d", c.in, i, ids[i], c.ids[i])
			}
		}
		// Nested: a list of lists and an object member pack each inner array.
		samePacked(t, []byte(`{"p":[`+c.in+`,`+c.in+`],"q":`+c.in+`}`), 0)
	}
	if _, ok := ArrayValue(NumberValue("1")).Uint32s(); ok {
		t.Error("a constructed array reports packed ids")
	}
	// Bounds: at, one over and far over maxElems, with the over-long array ending in
	// what cannot be packed (a fraction, a string, a cut) after the bound or before it.
	for _, n := range []int{1, 2, 3, 5, 8} {
		for _, count := range []int{n - 1, n, n + 1, 3 * n} {
			if count < 1 {
				continue
			}
			ids := strings.TrimSuffix(strings.Repeat("7,", count), ",")
			for _, tail := range []string{"]", ",1.5]", `,"x"]`, ",", ",01]", "]]"} {
				samePacked(t, []byte("["+ids+tail), n)
				samePacked(t, []byte("[1.5,"+ids+tail), n)
				samePacked(t, []byte(`{"a":[`+ids+tail+`}`), n)
			}
		}
	}
	// Over the bound the packed array is refused after at most the bound's ids.
	v, err := ParseValueLimit([]byte("["+strings.Repeat("123,", 1000)+"1]"), 100)
	if le, ok := err.(*LimitError); !ok || le.Max != 100 || v.Len() != 0 {
		t.Fatalf("1,001 ids under a bound of 100: %v", err)
	}
}

// FuzzPacked: on any input and bound, the packed parse and the tree parse agree (the
// same Value on every method, or the same error at the same offset).
func FuzzPacked(f *testing.F) {
	for _, s := range []string{`[1,2,3]`, `[[1,2],[3]]`, `{"prompt":[0,4294967295]}`, `[1,-1]`, `[1, 2 ,3.5]`,
		`[01]`, `[1,,2]`, `[4294967296]`, `[1,2,`, `[ 7 ]`, `[1,"x"]`, `[1e5]`} {
		f.Add([]byte(s), uint8(0))
		f.Add([]byte(s), uint8(2))
	}
	f.Fuzz(func(t *testing.T, data []byte, bound uint8) {
		samePacked(t, data, int(bound%8))
	})
}
