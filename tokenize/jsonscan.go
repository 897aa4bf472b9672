package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Hand scanners for the two large parts of tokenizer.json (the vocabulary object and
// the merges list: hundreds of thousands of entries). Decoding them through
// encoding/json's reflection was most of LoadModel's time; these read the bytes once.
// Strings with escapes fall back to encoding/json for exact JSON unescaping.

var errScan = errors.New("malformed JSON")

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	return i
}

// scanString reads the JSON string starting at b[i] == '"' and returns it and the
// index after its closing quote.
func scanString(b []byte, i int) (string, int, error) {
	if i >= len(b) || b[i] != '"' {
		return "", i, errScan
	}
	escaped := false
	j := i + 1
	for ; j < len(b); j++ {
		c := b[j]
		if c == '\\' {
			escaped = true
			j++
			continue
		}
		if c == '"' {
			break
		}
	}
	if j >= len(b) {
		return "", j, errScan
	}
	if !escaped {
		return string(b[i+1 : j]), j + 1, nil
	}
	var s string
	if err := json.Unmarshal(b[i:j+1], &s); err != nil {
		return "", j, err
	}
	return s, j + 1, nil
}

// scanVocab calls fn for each "token": id entry of a JSON object.
func scanVocab(b []byte, fn func(tok string, id uint32)) error {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return fmt.Errorf("vocab: %w: not an object", errScan)
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return nil
	}
	for {
		tok, j, err := scanString(b, i)
		if err != nil {
			return fmt.Errorf("vocab key at byte %d: %w", i, err)
		}
		j = skipWS(b, j)
		if j >= len(b) || b[j] != ':' {
			return fmt.Errorf("vocab: %w at byte %d", errScan, j)
		}
		j = skipWS(b, j+1)
		var id uint64
		k := j
		for k < len(b) && b[k] >= '0' && b[k] <= '9' {
			id = id*10 + uint64(b[k]-'0')
			k++
		}
		if k == j || id > 1<<32-1 {
			return fmt.Errorf("vocab: %w: id of %q", errScan, tok)
		}
		fn(tok, uint32(id))
		k = skipWS(b, k)
		if k < len(b) && b[k] == ',' {
			i = skipWS(b, k+1)
			continue
		}
		if k < len(b) && b[k] == '}' {
			return nil
		}
		return fmt.Errorf("vocab: %w at byte %d", errScan, k)
	}
}

// scanMerges calls fn for each merge of a JSON list written either as "a b" strings or
// as ["a", "b"] pairs.
func scanMerges(b []byte, fn func(a, c string) error) error {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '[' {
		return fmt.Errorf("merges: %w: not a list", errScan)
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return nil
	}
	for n := 0; ; n++ {
		var a, c string
		var err error
		switch {
		case i < len(b) && b[i] == '"':
			var s string
			if s, i, err = scanString(b, i); err != nil {
				return fmt.Errorf("merge %d: %w", n, err)
			}
			var ok bool
			for k := 0; k < len(s); k++ {
				if s[k] == ' ' {
					a, c, ok = s[:k], s[k+1:], true
					break
				}
			}
			if !ok {
				return fmt.Errorf("merge %d %q is not 'a b'", n, s)
			}
		case i < len(b) && b[i] == '[':
			i = skipWS(b, i+1)
			if a, i, err = scanString(b, i); err != nil {
				return fmt.Errorf("merge %d: %w", n, err)
			}
			i = skipWS(b, i)
			if i >= len(b) || b[i] != ',' {
				return fmt.Errorf("merge %d: %w", n, errScan)
			}
			if c, i, err = scanString(b, skipWS(b, i+1)); err != nil {
				return fmt.Errorf("merge %d: %w", n, err)
			}
			i = skipWS(b, i)
			if i >= len(b) || b[i] != ']' {
				return fmt.Errorf("merge %d: %w: not a pair", n, errScan)
			}
			i++
		default:
			return fmt.Errorf("merge %d: %w", n, errScan)
		}
		if err := fn(a, c); err != nil {
			return err
		}
		i = skipWS(b, i)
		if i < len(b) && b[i] == ',' {
			i = skipWS(b, i+1)
			continue
		}
		if i < len(b) && b[i] == ']' {
			return nil
		}
		return fmt.Errorf("merges: %w at byte %d", errScan, i)
	}
}
