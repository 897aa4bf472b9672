package jsonvalue

import "unsafe"

// packedValue is an array whose elements are the plain integer literals of ids (what
// the parser makes of a token-id prompt): their bytes are held in the s field, unused
// by arrays, so that a Value stays its size and 1 M ids take 4 MB instead of 1 M
// Members. Len, Index, Uint32s and AppendJSON read them; Index builds each element's
// Number Value, whose literal is the one the client wrote (plain literals are
// canonical: no sign, no leading zero).
func packedValue(ids []uint32) Value {
	if len(ids) == 0 {
		return Value{kind: Array}
	}
	return Value{kind: Array, s: unsafe.String((*byte)(unsafe.Pointer(unsafe.SliceData(ids))), 4*len(ids))}
}

// packed returns a packed array's elements (nil for any other Value).
func (v Value) packed() []uint32 {
	if v.kind != Array || len(v.s) == 0 {
		return nil
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.StringData(v.s))), len(v.s)/4)
}

// Uint32s returns the elements of an array that the parser stored packed, and true: an
// array of plain integer literals (no sign, fraction or exponent) that all fit uint32,
// such as a token-id prompt. The slice is shared: do not modify it. Any other Value,
// including arrays built by ArrayValue, gives nil, false: read those with Index.
func (v Value) Uint32s() ([]uint32, bool) {
	ids := v.packed()
	return ids, ids != nil
}

// packedArray reads, from its first element at p.i, an array whose elements are all
// plain integer literals that fit uint32 (a token-id prompt) into one exactly sized
// []uint32: 4 bytes per element instead of a Member each. A first pass counts the
// commas of the run of digits, commas and whitespace that starts there, stopping at
// maxElems of them; only a run that ends at ']' (or reaches the bound) is read: an
// array of anything else costs that scan (an array that does not start with a digit,
// not even that). ok is false, with p.i restored,
// when an element is anything else (a sign, a fraction, an exponent, a leading zero, a
// value past uint32, a syntax error): the caller parses the array again as a tree,
// which gives the same Value or error as ever. An element past maxElems is the
// *LimitError the tree gives, at the same offset, after at most maxElems ids.
func (p *parser) packedArray() (v Value, ok bool, err error) {
	b, start := p.b, p.i
	commas, j := 0, start
scan:
	for ; j < len(b); j++ {
		switch b[j] {
		case ',':
			commas++
			if p.maxElems > 0 && commas >= p.maxElems {
				break scan
			}
		case ' ', '\n', '\r', '\t', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		default:
			break scan
		}
	}
	capped := p.maxElems > 0 && commas >= p.maxElems
	if !capped && (j >= len(b) || b[j] != ']') {
		return Value{}, false, nil
	}
	n := commas + 1
	if capped {
		n = p.maxElems
	}
	ids := make([]uint32, 0, n)
	i := start
	for {
		// One element: "0" or a digit 1-9 and more digits, at most 4294967295.
		if i >= len(b) || !isDigit(b[i]) || (b[i] == '0' && i+1 < len(b) && isDigit(b[i+1])) {
			break
		}
		var x uint64
		for ; i < len(b) && isDigit(b[i]) && x <= maxUint32; i++ {
			x = x*10 + uint64(b[i]-'0')
		}
		if x > maxUint32 || (i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E')) {
			break
		}
		if len(ids) == n {
			if !capped {
				break
			}
			p.i = i
			return Value{}, true, &LimitError{Max: p.maxElems, Offset: int64(i)}
		}
		ids = append(ids, uint32(x))
		for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
			i++
		}
		if i >= len(b) {
			break
		}
		if b[i] == ']' {
			if len(ids) != n {
				break
			}
			p.i = i + 1
			return packedValue(ids), true, nil
		}
		if b[i] != ',' {
			break
		}
		i++
		for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
			i++
		}
	}
	p.i = start
	return Value{}, false, nil
}

const maxUint32 = 1<<32 - 1
