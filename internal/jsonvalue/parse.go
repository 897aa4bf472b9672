package jsonvalue

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/bits"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

type parser struct {
	b     []byte
	s     string // b as a string: unescaped strings are substrings of it
	i     int
	stack []Member // members of the containers being parsed
	// maxElems bounds the elements of one array (0 = none), checked before each
	// element is added: a 14 MB array of 7 M token ids would otherwise become 7 M
	// Members (~80 bytes each) before any field is read.
	maxElems int
	// tree turns packedArray off (tests compare the packed form with the tree).
	tree bool
}

func (p *parser) array(depth int) (Value, error) {
	p.i++ // '['
	base := len(p.stack)
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == ']' {
		p.i++
		return Value{kind: Array}, nil
	}
	if !p.tree && p.i < len(p.b) && isDigit(p.b[p.i]) {
		if v, ok, err := p.packedArray(); ok {
			return v, err
		}
	}
	for {
		v, err := p.value(depth + 1)
		if err != nil {
			return Value{}, err
		}
		if p.maxElems > 0 && len(p.stack)-base >= p.maxElems {
			return Value{}, &LimitError{Max: p.maxElems, Offset: int64(p.i)}
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
// never longer than its JSON, so the JSON string's length sizes the buffer.
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
	// The string ends at the first '"' after an even run of backslashes: find it, so
	// that one buffer holds the decoded text (an escaped quote early in a long string
	// would otherwise size it too small and grow it again and again).
	end := quote
	for {
		n := 0
		for j := end - 1; j >= i && b[j] == '\\'; j-- {
			n++
		}
		if n%2 == 0 {
			break
		}
		k := bytes.IndexByte(b[end+1:], '"')
		if k < 0 {
			end = len(b)
			break
		}
		end += 1 + k
	}
	out := make([]byte, max(end-start, 16)+8)
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

// ParseValue parses one complete JSON value (surrounding whitespace allowed). Strings
// must be valid UTF-8 (as Python's json.loads of the body bytes requires); invalid
// \u escapes of lone surrogates become U+FFFD. Errors are *SyntaxError.
//
// The result shares memory with data: every string without escapes (and every number
// literal) is a substring of data, not a copy, so data must not be modified while the
// Value is in use (request bodies are read once and only forwarded after parsing).
// Cost: one allocation per array or object and one per string with escapes;
// allocations grow with the number of values, not with their bytes, and no byte of the
// body is copied for unescaped text. An array of plain integers that fit uint32 (a
// token-id prompt) is stored packed, 4 bytes per element (Value.Uint32s): it behaves
// as the same array of Numbers for every other method.
func ParseValue(data []byte) (Value, error) { return ParseValueLimit(data, 0) }

// ParseValueLimit is ParseValue refusing, with a *LimitError, an array of more than
// maxElems elements (0 = no bound) as soon as its element maxElems+1 is read: what it
// allocated is bounded by maxElems elements per array, not by the body (a packed array
// of ids is allocated once, at most maxElems ids, from a count of its commas).
func ParseValueLimit(data []byte, maxElems int) (Value, error) {
	return parse(parser{b: data, maxElems: maxElems})
}

func parse(p parser) (Value, error) {
	data := p.b
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

// SyntaxError is a malformed JSON body. Offset is the byte offset after the offending
// byte (as encoding/json reports it).
type SyntaxError struct {
	Msg    string
	Offset int64
}

func (e *SyntaxError) Error() string { return e.Msg }

// LimitError is an array longer than ParseValueLimit's bound.
type LimitError struct {
	Max    int
	Offset int64 // byte offset where the extra element ends
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("an array has more than %d elements (at byte %d)", e.Max, e.Offset)
}

// MaxDepth bounds the nesting of arrays and objects (encoding/json's limit).
const MaxDepth = 10000

// linearDupLimit: objects up to this many members find a repeated key by a scan;
// larger ones (hostile bodies) use a map so that parsing stays linear.
const linearDupLimit = 16
