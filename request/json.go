package request

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/bits"
	"sort"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
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
	s    string   // String: the decoded text; Number: the literal as written
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
func (v Value) Text() string { return v.s }

// Boolean returns a bool's value (false for other kinds).
func (v Value) Boolean() bool { return v.kind == Bool && v.b }

// Len is the number of array elements or object members (0 for other kinds).
func (v Value) Len() int { return len(v.kids) }

// Index returns array element (or object member value) i; it panics when out of range.
func (v Value) Index(i int) Value { return v.kids[i].Value }

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

// SyntaxError is a malformed JSON body. Offset is the byte offset after the offending
// byte (as encoding/json reports it).
type SyntaxError struct {
	Msg    string
	Offset int64
}

func (e *SyntaxError) Error() string { return e.Msg }

// MaxDepth bounds the nesting of arrays and objects (encoding/json's limit).
const MaxDepth = 10000

// ParseValue parses one complete JSON value (surrounding whitespace allowed). Strings
// must be valid UTF-8 (as Python's json.loads of the body bytes requires); invalid
// \u escapes of lone surrogates become U+FFFD. Errors are *SyntaxError.
//
// The result shares memory with data: every string without escapes (and every number
// literal) is a substring of data, not a copy, so data must not be modified while the
// Value is in use (request bodies are read once and only forwarded after parsing).
// Cost: one allocation per array or object and one per string with escapes;
// allocations grow with the number of values, not with their bytes, and no byte of the
// body is copied for unescaped text.
func ParseValue(data []byte) (Value, error) {
	p := parser{b: data}
	p.s = unsafe.String(unsafe.SliceData(data), len(data))
	p.ws()
	v, err := p.value(0)
	if err != nil {
		return Value{}, err
	}
	p.ws()
	if p.i < len(p.b) {
		return Value{}, p.errChar("after top-level value")
	}
	return v, nil
}

type parser struct {
	b     []byte
	s     string // b as a string: unescaped strings are substrings of it
	i     int
	stack []Member // members of the containers being parsed
}

func (p *parser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\n', '\r', '\t':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) eof() error {
	return &SyntaxError{Msg: "unexpected end of JSON input", Offset: int64(len(p.b))}
}

// errChar is "invalid character 'x' <context>" for the byte at p.i (or EOF).
func (p *parser) errChar(context string) error {
	if p.i >= len(p.b) {
		return p.eof()
	}
	return &SyntaxError{Msg: "invalid character " + quoteChar(p.b[p.i]) + " " + context, Offset: int64(p.i + 1)}
}

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

func (p *parser) value(depth int) (Value, error) {
	if p.i >= len(p.b) {
		return Value{}, p.eof()
	}
	switch c := p.b[p.i]; c {
	case '"':
		s, err := p.str()
		return Value{kind: String, s: s}, err
	case '{':
		if depth >= MaxDepth {
			return Value{}, &SyntaxError{Msg: "exceeded max depth", Offset: int64(p.i + 1)}
		}
		return p.object(depth)
	case '[':
		if depth >= MaxDepth {
			return Value{}, &SyntaxError{Msg: "exceeded max depth", Offset: int64(p.i + 1)}
		}
		return p.array(depth)
	case 't':
		return Value{kind: Bool, b: true}, p.lit("true")
	case 'f':
		return Value{kind: Bool}, p.lit("false")
	case 'n':
		return Value{}, p.lit("null")
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			return p.number()
		}
		return Value{}, p.errChar("looking for beginning of value")
	}
}

func (p *parser) lit(word string) error {
	for k := 0; k < len(word); k++ {
		if p.i >= len(p.b) {
			return p.eof()
		}
		if p.b[p.i] != word[k] {
			return p.errChar(fmt.Sprintf("in literal %s (expecting %s)", word, quoteChar(word[k])))
		}
		p.i++
	}
	return nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func (p *parser) number() (Value, error) {
	start := p.i
	b := p.b
	if b[p.i] == '-' {
		p.i++
	}
	if p.i >= len(b) {
		return Value{}, p.eof()
	}
	switch {
	case b[p.i] == '0':
		p.i++
	case isDigit(b[p.i]):
		for p.i < len(b) && isDigit(b[p.i]) {
			p.i++
		}
	default:
		return Value{}, p.errChar("in numeric literal")
	}
	if p.i < len(b) && b[p.i] == '.' {
		p.i++
		if p.i >= len(b) {
			return Value{}, p.eof()
		}
		if !isDigit(b[p.i]) {
			return Value{}, p.errChar("after decimal point in numeric literal")
		}
		for p.i < len(b) && isDigit(b[p.i]) {
			p.i++
		}
	}
	if p.i < len(b) && (b[p.i] == 'e' || b[p.i] == 'E') {
		p.i++
		if p.i < len(b) && (b[p.i] == '+' || b[p.i] == '-') {
			p.i++
		}
		if p.i >= len(b) {
			return Value{}, p.eof()
		}
		if !isDigit(b[p.i]) {
			return Value{}, p.errChar("in exponent of numeric literal")
		}
		for p.i < len(b) && isDigit(b[p.i]) {
			p.i++
		}
	}
	return Value{kind: Number, s: p.s[start:p.i]}, nil
}

// SWAR over 8 bytes: ctlOrHigh flags the bytes that are a control character (< 0x20)
// or non-ASCII (≥ 0x80); ctl flags only control characters. The lowest flag is exact.
const (
	lo8 = 0x0101010101010101
	hi8 = 0x8080808080808080
)

func ctlOrHigh(w uint64) uint64 { return ((w - lo8*0x20) | w) & hi8 }
func ctl(w uint64) uint64       { return (w - lo8*0x20) &^ w & hi8 }

// str reads the string at p.b[p.i] == '"'. The closing quote and any backslash are
// found with bytes.IndexByte (vectorized); the run between is checked 8 bytes at a time
// for control characters and, when it has non-ASCII bytes, for valid UTF-8.
func (p *parser) str() (string, error) {
	b := p.b
	start := p.i + 1
	q := bytes.IndexByte(b[start:], '"')
	if q < 0 {
		p.i = len(b)
		return "", p.eof()
	}
	end := start + q
	seg := b[start:end]
	if k := bytes.IndexByte(seg, '\\'); k >= 0 {
		return p.strEscaped(start, start+k, end)
	}
	i := 0
	for ; i+8 <= len(seg); i += 8 {
		if m := ctlOrHigh(binary.LittleEndian.Uint64(seg[i:])); m != 0 {
			i += bits.TrailingZeros64(m) >> 3
			return p.strCheck(start, end, i)
		}
	}
	for ; i < len(seg); i++ {
		if c := seg[i]; c < 0x20 || c >= 0x80 {
			return p.strCheck(start, end, i)
		}
	}
	p.i = end + 1
	return p.s[start:end], nil
}

// strCheck finishes str for a run with a control or non-ASCII byte at offset i.
func (p *parser) strCheck(start, end, i int) (string, error) {
	seg := p.b[start:end]
	for j := i; j < len(seg); j++ {
		if j+8 <= len(seg) && ctl(binary.LittleEndian.Uint64(seg[j:])) == 0 {
			j += 7
			continue
		}
		if seg[j] < 0x20 {
			p.i = start + j
			return "", p.errChar("in string literal")
		}
	}
	if !utf8.Valid(seg[i:]) {
		off := start + i
		for off < end {
			r, n := utf8.DecodeRune(p.b[off:end])
			if r == utf8.RuneError && n == 1 {
				break
			}
			off += n
		}
		return "", &SyntaxError{Msg: "invalid UTF-8 in string literal", Offset: int64(off + 1)}
	}
	p.i = end + 1
	return p.s[start:end], nil
}

// strEscaped decodes a string from start whose first escape is at b[i] == '\\'; the
// first '"' after start is at quote (the end, unless it is escaped): decoded text is
// never longer than its JSON, so that sizes the buffer.
func (p *parser) strEscaped(start, i, quote int) (string, error) {
	b := p.b
	pre := b[start:i]
	for j, c := range pre {
		if c < 0x20 {
			p.i = start + j
			return "", p.errChar("in string literal")
		}
	}
	if !utf8.Valid(pre) {
		return "", &SyntaxError{Msg: "invalid UTF-8 in string literal", Offset: int64(i)}
	}
	out := make([]byte, max(quote-start, 16)+8)
	w := copy(out, pre)
	for {
		// Plain ASCII eight bytes at a time, up to the next byte that needs a look.
		for i+8 <= len(b) && w+8 <= len(out) {
			x := binary.LittleEndian.Uint64(b[i:])
			binary.LittleEndian.PutUint64(out[w:], x) // bytes past a stop are overwritten
			if m := stopMask(x); m != 0 {
				k := bits.TrailingZeros64(m) >> 3
				i, w = i+k, w+k
				break
			}
			i, w = i+8, w+8
		}
		if i >= len(b) {
			p.i = len(b)
			return "", p.eof()
		}
		if w+8 > len(out) { // room for one escape or rune
			out = append(out[:w], make([]byte, len(out)+8)...)
			out = out[:cap(out)]
		}
		c := b[i]
		switch {
		case c == '"':
			p.i = i + 1
			if w == 0 {
				return "", nil
			}
			return unsafe.String(&out[0], w), nil // out is never written again
		case c == '\\':
			i++
			if i >= len(b) {
				p.i = len(b)
				return "", p.eof()
			}
			e := b[i]
			i++
			switch e {
			case '"', '\\', '/':
				out[w] = e
			case 'b':
				out[w] = '\b'
			case 'f':
				out[w] = '\f'
			case 'n':
				out[w] = '\n'
			case 'r':
				out[w] = '\r'
			case 't':
				out[w] = '\t'
			case 'u':
				r, ok := hex4(b, i)
				if !ok {
					p.i = min(i+4, len(b))
					if i+4 > len(b) {
						return "", p.eof()
					}
					return "", &SyntaxError{Msg: "invalid character in \\u hexadecimal character escape", Offset: int64(i)}
				}
				i += 4
				if utf16.IsSurrogate(r) {
					// A pair: \uD8xx\uDCxx. A lone surrogate becomes U+FFFD (as encoding/json).
					r2 := rune(-1)
					if i+6 <= len(b) && b[i] == '\\' && b[i+1] == 'u' {
						r2, ok = hex4(b, i+2)
						if !ok {
							r2 = -1
						}
					}
					if d := utf16.DecodeRune(r, r2); r2 >= 0 && d != utf8.RuneError {
						r = d
						i += 6
					} else {
						r = utf8.RuneError
					}
				}
				w += utf8.EncodeRune(out[w:], r)
				continue
			default:
				p.i = i - 1
				return "", p.errChar("in string escape code")
			}
			w++
		case c < 0x20:
			p.i = i
			return "", p.errChar("in string literal")
		case c < 0x80:
			out[w] = c
			i, w = i+1, w+1
		default:
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				return "", &SyntaxError{Msg: "invalid UTF-8 in string literal", Offset: int64(i + 1)}
			}
			w += copy(out[w:], b[i:i+n])
			i += n
		}
	}
}

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

// linearDupLimit: objects up to this many members find a repeated key by a scan;
// larger ones (hostile bodies) use a map so that parsing stays linear.
const linearDupLimit = 16

func (p *parser) object(depth int) (Value, error) {
	p.i++ // '{'
	base := len(p.stack)
	var index map[string]int
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		return Value{kind: Object}, nil
	}
	for {
		if p.i >= len(p.b) {
			return Value{}, p.eof()
		}
		if p.b[p.i] != '"' {
			return Value{}, p.errChar("looking for beginning of object key string")
		}
		key, err := p.str()
		if err != nil {
			return Value{}, err
		}
		p.ws()
		if p.i >= len(p.b) {
			return Value{}, p.eof()
		}
		if p.b[p.i] != ':' {
			return Value{}, p.errChar("after object key")
		}
		p.i++
		p.ws()
		v, err := p.value(depth + 1)
		if err != nil {
			return Value{}, err
		}
		// A repeated key keeps its first position and takes the last value (json.loads).
		n := len(p.stack) - base
		dup := -1
		if index != nil {
			if k, ok := index[key]; ok {
				dup = k
			}
		} else {
			for k := base; k < len(p.stack); k++ {
				if p.stack[k].Key == key {
					dup = k - base
					break
				}
			}
		}
		if dup >= 0 {
			p.stack[base+dup].Value = v
		} else {
			p.stack = append(p.stack, Member{Key: key, Value: v})
			if index != nil {
				index[key] = n
			} else if n+1 > linearDupLimit {
				index = make(map[string]int, 2*linearDupLimit)
				for k := base; k < len(p.stack); k++ {
					index[p.stack[k].Key] = k - base
				}
			}
		}
		p.ws()
		if p.i >= len(p.b) {
			return Value{}, p.eof()
		}
		switch p.b[p.i] {
		case ',':
			p.i++
			p.ws()
			continue
		case '}':
			p.i++
			return Value{kind: Object, kids: p.pop(base)}, nil
		}
		return Value{}, p.errChar("after object key:value pair")
	}
}

// pop moves the members pushed since base off the shared stack into their own slice
// (exactly sized), clearing the stack slots so they hold no references.
func (p *parser) pop(base int) []Member {
	kids := make([]Member, len(p.stack)-base)
	copy(kids, p.stack[base:])
	clear(p.stack[base:])
	p.stack = p.stack[:base]
	return kids
}

func (p *parser) array(depth int) (Value, error) {
	p.i++ // '['
	base := len(p.stack)
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == ']' {
		p.i++
		return Value{kind: Array}, nil
	}
	for {
		v, err := p.value(depth + 1)
		if err != nil {
			return Value{}, err
		}
		p.stack = append(p.stack, Member{Value: v})
		p.ws()
		if p.i >= len(p.b) {
			return Value{}, p.eof()
		}
		switch p.b[p.i] {
		case ',':
			p.i++
			p.ws()
			continue
		case ']':
			p.i++
			return Value{kind: Array, kids: p.pop(base)}, nil
		}
		return Value{}, p.errChar("after array element")
	}
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
