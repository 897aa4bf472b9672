package jsonvalue

import "strings"

// SniffString returns the top-level string member key of a JSON object that may be
// truncated (a body cut at a buffer limit), with the rule a full parse applies: names
// match exactly and a repeated key takes its last value. sure is true when the whole
// object was read, so no later member key can follow. A value that is itself cut, or
// that a later cut member key overrides, gives "", false. It returns "" when data is
// not a JSON object or the member is absent or not a string. The result is a copy.
func SniffString(data []byte, key string) (value string, sure bool) {
	last := ""
	p := parser{b: data, s: string(data)}
	p.ws()
	if p.i >= len(p.b) || p.b[p.i] != '{' {
		return "", false
	}
	p.i++
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		return "", true
	}
	for {
		if p.i >= len(p.b) || p.b[p.i] != '"' {
			return strings.Clone(last), false
		}
		name, err := p.str()
		if err != nil {
			return cut(last, name == key), false
		}
		p.ws()
		if p.i >= len(p.b) || p.b[p.i] != ':' {
			return cut(last, name == key), false
		}
		p.i++
		p.ws()
		v, err := p.value(1)
		if err != nil {
			return cut(last, name == key), false
		}
		if name == key {
			last, _ = v.Str()
		}
		p.ws()
		if p.i >= len(p.b) {
			return strings.Clone(last), false
		}
		switch p.b[p.i] {
		case ',':
			p.i++
			p.ws()
		case '}':
			p.i++
			return strings.Clone(last), true
		default:
			return strings.Clone(last), false
		}
	}
}

// cut is the sniffed value when the data ends inside a member: a cut member of the
// sniffed key overrides what came before, with a value that cannot be known.
func cut(last string, isKey bool) string {
	if isKey {
		return ""
	}
	return strings.Clone(last)
}
