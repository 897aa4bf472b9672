package kvevents

import "fmt"

// MaxDepth is the deepest msgpack nesting a payload may have. vLLM's deepest value is
// batch → events → event → extra_keys → one block's keys → a multimodal (hash,
// offset) tuple: 6 levels.
const MaxDepth = 16

// checkShape walks payload as one msgpack value without decoding it and fails when a
// declared length (str, bin, ext, array, map) exceeds the bytes left, when nesting is
// deeper than MaxDepth, or on an invalid code or a truncated value. After it succeeds,
// every array or map declares at most one element per remaining byte and every
// str/bin at most the remaining bytes, so allocations sized from declared lengths are
// bounded by the payload's size. Trailing bytes are left to the decoder to report.
//
// Format: https://github.com/msgpack/msgpack/blob/master/spec.md. One pass, no
// allocation, no recursion (a stack of pending element counts, one per level).
func checkShape(p []byte) error {
	var pending [MaxDepth + 1]uint64 // values still to read at each open level
	top := 0
	pending[0] = 1
	i := 0
	for top >= 0 {
		if pending[top] == 0 {
			top--
			continue
		}
		pending[top]--
		if i >= len(p) {
			return fmt.Errorf("truncated at byte %d", i)
		}
		c := p[i]
		i++
		left := uint64(len(p) - i)
		var skip, n uint64 // n: nested values (array elements, map keys + values)
		container := false
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		case c >= 0x80 && c <= 0x8f:
			n, container = 2*uint64(c&0x0f), true
		case c >= 0x90 && c <= 0x9f:
			n, container = uint64(c&0x0f), true
		case c >= 0xa0 && c <= 0xbf:
			skip = uint64(c & 0x1f)
		default:
			var lenBytes, extra uint64 // width of the length field; bytes after it (ext type)
			switch c {
			case 0xcc, 0xd0:
				skip = 1
			case 0xcd, 0xd1:
				skip = 2
			case 0xca, 0xce, 0xd2:
				skip = 4
			case 0xcb, 0xcf, 0xd3:
				skip = 8
			case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1..16 + type byte
				skip = 1 + 1<<(c-0xd4)
			case 0xc4, 0xd9:
				lenBytes = 1
			case 0xc5, 0xda:
				lenBytes = 2
			case 0xc6, 0xdb:
				lenBytes = 4
			case 0xc7:
				lenBytes, extra = 1, 1
			case 0xc8:
				lenBytes, extra = 2, 1
			case 0xc9:
				lenBytes, extra = 4, 1
			case 0xdc:
				lenBytes, container = 2, true
			case 0xdd:
				lenBytes, container = 4, true
			case 0xde:
				lenBytes, container = 2, true
			case 0xdf:
				lenBytes, container = 4, true
			default: // 0xc1: never used
				return fmt.Errorf("invalid msgpack code %#x at byte %d", c, i-1)
			}
			if lenBytes > 0 {
				if left < lenBytes {
					return fmt.Errorf("truncated length at byte %d", i)
				}
				var l uint64
				for _, b := range p[i : i+int(lenBytes)] {
					l = l<<8 | uint64(b)
				}
				i += int(lenBytes)
				left -= lenBytes
				switch {
				case c == 0xde || c == 0xdf:
					n = 2 * l
				case container:
					n = l
				default:
					skip = l + extra
				}
			}
		}
		if container {
			if n > left {
				return fmt.Errorf("byte %d declares %d nested values, only %d bytes left", i, n, left)
			}
			if n > 0 {
				if top == MaxDepth {
					return fmt.Errorf("nesting deeper than %d at byte %d", MaxDepth, i)
				}
				top++
				pending[top] = n
			}
			continue
		}
		if skip > left {
			return fmt.Errorf("byte %d declares %d bytes, only %d left", i, skip, left)
		}
		i += int(skip)
	}
	return nil
}
