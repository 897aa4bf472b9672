package jsonvalue

import (
	"fmt"
	"sort"
	"strconv"
)

// Kind is the JSON type of a Value.
type Kind uint8

// The JSON types. The zero Value is Null.
const (
	Null Kind = iota
	Bool
	Number
	String
	Array
	Object
)

var kindNames = [...]string{Null: "null", Bool: "bool", Number: "number", String: "string", Array: "array", Object: "object"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "invalid"
}

// Value is one JSON value as the client sent it, in the form Python's json.loads gives
// vLLM (what chat templates see): objects keep their keys in first-occurrence order and a
// repeated key takes its last value; numbers keep their literal text (so int vs float and
// digits beyond float64 survive); strings are decoded. The zero Value is JSON null.
// A Value is immutable once parsed and safe to share.
type Value struct {
	kind Kind
	b    bool
	// String: the decoded text; Number: the literal as written; a packed Array (kids
	// nil): its elements as native-endian uint32s, 4 bytes each (see packedValue).
	s    string
	kids []Member // Array: elements (Key ""); Object: members in order
}

// Member is one object member (or array element, with Key "").
type Member struct {
	Key   string
	Value Value
}

// Kind returns the JSON type.
func (v Value) Kind() Kind { return v.kind }

// IsNull reports whether v is JSON null (or absent: the zero Value).
func (v Value) IsNull() bool { return v.kind == Null }

// Str returns a string's text and true, or "" and false for any other kind.
func (v Value) Str() (string, bool) {
	if v.kind != String {
		return "", false
	}
	return v.s, true
}

// Text returns a string's text, a number's literal, or "" for other kinds.
func (v Value) Text() string {
	if v.kind != String && v.kind != Number {
		return ""
	}
	return v.s
}

// Boolean returns a bool's value (false for other kinds).
func (v Value) Boolean() bool { return v.kind == Bool && v.b }

// Len is the number of array elements or object members (0 for other kinds).
func (v Value) Len() int {
	if v.kind == Array && v.kids == nil {
		return len(v.s) / 4
	}
	return len(v.kids)
}

// Index returns array element (or object member value) i; it panics when out of range.
func (v Value) Index(i int) Value {
	if ids := v.packed(); ids != nil {
		return Value{kind: Number, s: strconv.FormatUint(uint64(ids[i]), 10)}
	}
	return v.kids[i].Value
}

// Members returns an object's members in order (nil for other kinds). The slice is
// shared: do not modify it.
func (v Value) Members() []Member {
	if v.kind != Object {
		return nil
	}
	return v.kids
}

// Get returns the value of an object's member key, matched exactly (case-sensitive, as
// vLLM matches field names); false when v is not an object or has no such key.
func (v Value) Get(key string) (Value, bool) {
	if v.kind != Object {
		return Value{}, false
	}
	for i := range v.kids {
		if v.kids[i].Key == key {
			return v.kids[i].Value, true
		}
	}
	return Value{}, false
}

// Field is Get without the presence flag (null when absent).
func (v Value) Field(key string) Value {
	x, _ := v.Get(key)
	return x
}

// Int returns a number that is a JSON integer literal fitting int64.
func (v Value) Int() (int64, bool) {
	if v.kind != Number || !isIntLiteral(v.s) {
		return 0, false
	}
	n, err := strconv.ParseInt(v.s, 10, 64)
	return n, err == nil
}

// IsInt reports whether a number is written as an integer (no fraction, no exponent):
// what json.loads turns into a Python int.
func (v Value) IsInt() bool { return v.kind == Number && isIntLiteral(v.s) }

func isIntLiteral(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '.' || c == 'e' || c == 'E' {
			return false
		}
	}
	return true
}

// Constructors, for values kvroute builds itself (converted conversations, tests).

// StringValue returns a JSON string.
func StringValue(s string) Value { return Value{kind: String, s: s} }

// BoolValue returns a JSON boolean.
func BoolValue(b bool) Value { return Value{kind: Bool, b: b} }

// NumberValue returns a JSON number from its literal text; it is not validated.
func NumberValue(text string) Value { return Value{kind: Number, s: text} }

// ArrayValue returns a JSON array of items.
func ArrayValue(items ...Value) Value {
	kids := make([]Member, len(items))
	for i, it := range items {
		kids[i].Value = it
	}
	return Value{kind: Array, kids: kids}
}

// ObjectValue returns a JSON object with members in the given order; a repeated key
// keeps its first position and takes the last value.
func ObjectValue(members ...Member) Value {
	kids := make([]Member, 0, len(members))
	for _, m := range members {
		found := false
		for i := range kids {
			if kids[i].Key == m.Key {
				kids[i].Value, found = m.Value, true
				break
			}
		}
		if !found {
			kids = append(kids, m)
		}
	}
	return Value{kind: Object, kids: kids}
}

// ValueOf converts decoded Go JSON (nil, bool, float64, int, json.Number-like strings are
// strings, string, []any, map[string]any, []map[string]any) to a Value; map keys are
// sorted since Go maps have no order. For tests and callers that hold Go values.
func ValueOf(x any) Value {
	switch t := x.(type) {
	case nil:
		return Value{}
	case Value:
		return t
	case bool:
		return BoolValue(t)
	case string:
		return StringValue(t)
	case int:
		return NumberValue(strconv.Itoa(t))
	case int64:
		return NumberValue(strconv.FormatInt(t, 10))
	case float64:
		return NumberValue(strconv.FormatFloat(t, 'g', -1, 64))
	case []any:
		items := make([]Value, len(t))
		for i, e := range t {
			items[i] = ValueOf(e)
		}
		return ArrayValue(items...)
	case []map[string]any:
		items := make([]Value, len(t))
		for i, e := range t {
			items[i] = ValueOf(e)
		}
		return ArrayValue(items...)
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		ms := make([]Member, len(keys))
		for i, k := range keys {
			ms[i] = Member{Key: k, Value: ValueOf(t[k])}
		}
		return Value{kind: Object, kids: ms}
	}
	return StringValue(fmt.Sprint(x))
}

// MarshalJSON writes v as compact JSON: keys in order, numbers as written.
func (v Value) MarshalJSON() ([]byte, error) { return v.AppendJSON(nil), nil }

// AppendJSON appends v as compact JSON to dst.
func (v Value) AppendJSON(dst []byte) []byte {
	switch v.kind {
	case Null:
		return append(dst, "null"...)
	case Bool:
		if v.b {
			return append(dst, "true"...)
		}
		return append(dst, "false"...)
	case Number:
		return append(dst, v.s...)
	case String:
		return appendQuoted(dst, v.s)
	case Array:
		dst = append(dst, '[')
		if ids := v.packed(); ids != nil {
			for i, id := range ids {
				if i > 0 {
					dst = append(dst, ',')
				}
				dst = strconv.AppendUint(dst, uint64(id), 10)
			}
			return append(dst, ']')
		}
		for i := range v.kids {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = v.kids[i].Value.AppendJSON(dst)
		}
		return append(dst, ']')
	}
	dst = append(dst, '{')
	for i := range v.kids {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendQuoted(dst, v.kids[i].Key)
		dst = append(dst, ':')
		dst = v.kids[i].Value.AppendJSON(dst)
	}
	return append(dst, '}')
}

const hexDigits = "0123456789abcdef"

// appendQuoted writes s as a JSON string, escaping only what JSON requires.
func appendQuoted(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// ---- parsing -----------------------------------------------------------------------

func quoteChar(c byte) string {
	switch {
	case c == '\'':
		return `'\''`
	case c == '"':
		return `'"'`
	case c < 0x20 || c >= 0x7f:
		return strconv.Quote(string(rune(c)))
	}
	return "'" + string(c) + "'"
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// SWAR over 8 bytes: ctlOrHigh flags the bytes that are a control character (< 0x20)
// or non-ASCII (≥ 0x80); ctl flags only control characters. The lowest flag is exact.
const (
	lo8 = 0x0101010101010101
	hi8 = 0x8080808080808080
)

func ctlOrHigh(w uint64) uint64 { return ((w - lo8*0x20) | w) & hi8 }
func ctl(w uint64) uint64       { return (w - lo8*0x20) &^ w & hi8 }

// stopMask flags (lowest flag exact) the bytes of w that end a plain run of string
// text: '"', '\\', a control character or a non-ASCII byte.
func stopMask(w uint64) uint64 {
	q := w ^ (lo8 * '"')
	bs := w ^ (lo8 * '\\')
	return ((q - lo8) &^ q & hi8) | ((bs - lo8) &^ bs & hi8) | ctlOrHigh(w)
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// MessagesOf converts Go-map messages to Values (keys sorted), for callers and tests
// that build conversations in Go.
func MessagesOf(msgs []map[string]any) []Value {
	out := make([]Value, len(msgs))
	for i, m := range msgs {
		out[i] = ValueOf(m)
	}
	return out
}
