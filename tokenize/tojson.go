package tokenize

import (
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
	"github.com/kvroute/kvroute/internal/jsonvalue"
)

// Chat templates print tool schemas and tool-call arguments with tojson, which
// transformers defines as json.dumps(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False) over the Python objects json.loads built from the
// request. The jinja engine's own tojson prints floats with Go's %g (1.0 → "1",
// 1e6 → "1e+06"), orders indented dicts by key and escapes U+2028, so templates are
// compiled with `|tojson` routed to pyToJSON, which follows json.dumps exactly:
// Python's float repr, ints of any size, key order as sent, Python's string escapes.

// tojsonFilter is the name tojson calls are rewritten to (a template variable: the
// engine looks a filter up in its builtins, then in the template's variables).
const tojsonFilter = "kvroute_tojson"

var tojsonCall = regexp.MustCompile(`\|\s*tojson\b`)

// routeTojson rewrites `| tojson` filter uses in a template source to tojsonFilter.
func routeTojson(src string) string {
	return tojsonCall.ReplaceAllString(src, "|"+tojsonFilter)
}

var tojsonValue = jinja.NewCallable(tojsonFilter, pyToJSON)

// bigIntPrefix marks a JSON integer beyond int64, carried as a callable whose name
// holds the digits (the engine has no big integers): tojson prints it exactly.
const bigIntPrefix = "\x00int:"

func bigInt(text string) jinja.Value {
	return jinja.NewCallable(bigIntPrefix+text, func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
		return jinja.Undefined(), fmt.Errorf("an integer is not callable")
	})
}

// toJinja converts a parsed request value to the template's value: objects keep key
// order, integers (any size) stay integers, other numbers become floats as
// json.loads makes them.
func toJinja(v jsonvalue.Value) jinja.Value {
	switch v.Kind() {
	case jsonvalue.Null:
		return jinja.None()
	case jsonvalue.Bool:
		return jinja.NewBool(v.Boolean())
	case jsonvalue.String:
		return jinja.NewString(v.Text())
	case jsonvalue.Number:
		if v.IsInt() {
			if n, ok := v.Int(); ok {
				return jinja.NewInt(n)
			}
			return bigInt(v.Text())
		}
		f, _ := strconv.ParseFloat(v.Text(), 64) // ±Inf past the range, as float()
		return jinja.NewFloat(f)
	case jsonvalue.Array:
		items := make([]jinja.Value, v.Len())
		for i := range items {
			items[i] = toJinja(v.Index(i))
		}
		return jinja.NewList(items)
	}
	d := jinja.NewDict()
	dict := d.AsDict()
	for _, m := range v.Members() {
		dict.Set(m.Key, toJinja(m.Value))
	}
	return d
}

// pyToJSON is tojson(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False), positional or keyword.
func pyToJSON(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.NewString(""), nil
	}
	o := dumpOpts{}
	opt := func(pos int, name string) (jinja.Value, bool) {
		if v, ok := kwargs[name]; ok {
			return v, true
		}
		if pos < len(args) {
			return args[pos], true
		}
		return jinja.Undefined(), false
	}
	if v, ok := opt(1, "ensure_ascii"); ok {
		o.ascii = v.IsTruthy()
	}
	if v, ok := opt(2, "indent"); ok && !v.IsNone() && !v.IsUndefined() {
		switch {
		case v.IsString():
			o.indent = v.AsString()
		case v.IsInt():
			o.indent = strings.Repeat(" ", int(max(0, min(v.AsInt(), 64))))
		default:
			return jinja.Undefined(), fmt.Errorf("tojson: indent must be an integer or a string")
		}
		o.indented = true
	}
	o.item, o.key = ", ", ": "
	if o.indented {
		o.item = ","
	}
	if v, ok := opt(3, "separators"); ok && !v.IsNone() && !v.IsUndefined() {
		if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Items[0].IsString() || !v.AsList().Items[1].IsString() {
			return jinja.Undefined(), fmt.Errorf("tojson: separators must be two strings")
		}
		o.item, o.key = v.AsList().Items[0].AsString(), v.AsList().Items[1].AsString()
	}
	if v, ok := opt(4, "sort_keys"); ok {
		o.sort = v.IsTruthy()
	}
	var sb strings.Builder
	if err := o.dump(&sb, args[0], 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(sb.String()), nil
}

type dumpOpts struct {
	ascii, indented, sort bool
	indent, item, key     string
}

func (o *dumpOpts) newline(sb *strings.Builder, level int) {
	sb.WriteByte('\n')
	for range level {
		sb.WriteString(o.indent)
	}
}

func (o *dumpOpts) dump(sb *strings.Builder, v jinja.Value, level int) error {
	switch {
	case v.IsNone() || v.IsUndefined():
		sb.WriteString("null")
	case v.IsBool():
		if v.AsBool() {
			sb.WriteString("true")
		} else {
			sb.WriteString("false")
		}
	case v.IsInt():
		sb.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		sb.WriteString(pyFloatRepr(v.AsFloat()))
	case v.IsString():
		o.str(sb, v.AsString())
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			sb.WriteString("[]")
			return nil
		}
		sb.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				sb.WriteString(o.item)
			}
			if o.indented {
				o.newline(sb, level+1)
			}
			if err := o.dump(sb, it, level+1); err != nil {
				return err
			}
		}
		if o.indented {
			o.newline(sb, level)
		}
		sb.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		if len(d.Keys) == 0 {
			sb.WriteString("{}")
			return nil
		}
		keys := d.Keys
		if o.sort {
			keys = append([]string(nil), keys...)
			sort.Strings(keys)
		}
		sb.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				sb.WriteString(o.item)
			}
			if o.indented {
				o.newline(sb, level+1)
			}
			o.str(sb, k)
			sb.WriteString(o.key)
			if err := o.dump(sb, d.Data[k], level+1); err != nil {
				return err
			}
		}
		if o.indented {
			o.newline(sb, level)
		}
		sb.WriteByte('}')
	case v.IsCallable():
		if name := v.AsCallable().Name; strings.HasPrefix(name, bigIntPrefix) {
			sb.WriteString(name[len(bigIntPrefix):])
			return nil
		}
		return fmt.Errorf("tojson: a callable is not JSON serializable")
	default:
		sb.WriteString("null")
	}
	return nil
}

// str writes s as json.dumps does: '"', '\\' and control characters escaped (\n, \r,
// \t, \b, \f by name, others as \u00xx); with ensure_ascii every non-ASCII character
// (and DEL) as \uxxxx, astral ones as a surrogate pair.
func (o *dumpOpts) str(sb *strings.Builder, s string) {
	sb.WriteByte('"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && (c < 0x7f || (!o.ascii && c >= 0x80)) {
			i++
			continue
		}
		sb.WriteString(s[start:i])
		n := 1
		switch c {
		case '"':
			sb.WriteString(`\"`)
		case '\\':
			sb.WriteString(`\\`)
		case '\n':
			sb.WriteString(`\n`)
		case '\r':
			sb.WriteString(`\r`)
		case '\t':
			sb.WriteString(`\t`)
		case '\b':
			sb.WriteString(`\b`)
		case '\f':
			sb.WriteString(`\f`)
		default:
			if c < 0x80 {
				writeU(sb, rune(c))
				break
			}
			r, size := utf8.DecodeRuneInString(s[i:])
			n = size
			if r > 0xffff {
				r -= 0x10000
				writeU(sb, 0xd800+(r>>10))
				writeU(sb, 0xdc00+(r&0x3ff))
			} else {
				writeU(sb, r)
			}
		}
		i += n
		start = i
	}
	sb.WriteString(s[start:])
	sb.WriteByte('"')
}

func writeU(sb *strings.Builder, r rune) {
	const hex = "0123456789abcdef"
	sb.WriteString(`\u`)
	sb.WriteByte(hex[r>>12&0xf])
	sb.WriteByte(hex[r>>8&0xf])
	sb.WriteByte(hex[r>>4&0xf])
	sb.WriteByte(hex[r&0xf])
}

// pyFloatRepr is Python's repr(float) (json.dumps's float format): the shortest
// digits that round-trip, positional with at least one fractional digit ("1000.0",
// "0.0001") for decimal exponents in [-4, 16), scientific otherwise ("1e+16",
// "1e-05", "1.5e+300"); infinities and NaN as json.dumps writes them.
func pyFloatRepr(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	case math.IsNaN(f):
		return "NaN"
	case f == 0:
		if math.Signbit(f) {
			return "-0.0"
		}
		return "0.0"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64)
	exp, _ := strconv.Atoi(e[strings.IndexByte(e, 'e')+1:])
	if exp < -4 || exp >= 16 {
		return e
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsRune(s, '.') {
		s += ".0"
	}
	return s
}
