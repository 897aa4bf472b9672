package classify

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
)

// MaxRowBytes bounds one JSONL line of a training or evaluation file.
const MaxRowBytes = 1 << 20

func sortStrings(s []string) { sort.Strings(s) }

// openData opens path, transparently gunzipping it when it starts with the gzip magic
// bytes (RFC 1952 §2.3.1: 0x1f 0x8b), whatever its name.
func openData(path string) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	br := bufio.NewReader(f)
	magic, _ := br.Peek(2)
	if bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return struct {
			io.Reader
			io.Closer
		}{zr, f}, nil
	}
	return struct {
		io.Reader
		io.Closer
	}{br, f}, nil
}

// eachLine calls fn with every non-blank line of path (1-based line numbers); a line
// over MaxRowBytes is an error naming its line.
func eachLine(path string, fn func(line int, b []byte) error) error {
	rc, err := openData(path)
	if err != nil {
		return err
	}
	defer rc.Close()
	sc := bufio.NewScanner(rc)
	sc.Buffer(make([]byte, 64<<10), MaxRowBytes)
	n := 0
	for sc.Scan() {
		n++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if err := fn(n, b); err != nil {
			return fmt.Errorf("%s:%d: %w", path, n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: after line %d: %w", path, n, err)
	}
	return nil
}

// ReadRows reads labelled JSONL rows {"text": ..., "label": ...} from path (gzip or
// plain). A row that is not a JSON object, or lacks a text or a label, is an error that
// names its line: a training set with a broken row is not silently trained on.
func ReadRows(path string) ([]Row, error) {
	return readJSONL(path, func(r *Row) error {
		if r.Text == "" || r.Label == "" {
			return fmt.Errorf("row needs a non-empty \"text\" and \"label\"")
		}
		return nil
	})
}

// readJSONL decodes every non-blank line of path as a T and checks it; an error names
// its line, and a file without rows is an error.
func readJSONL[T any](path string, check func(*T) error) ([]T, error) {
	var rows []T
	err := eachLine(path, func(_ int, b []byte) error {
		var r T
		if err := json.Unmarshal(b, &r); err != nil {
			return err
		}
		if err := check(&r); err != nil {
			return err
		}
		rows = append(rows, r)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%s: no rows", path)
	}
	return rows, nil
}

// Folds splits rows into k folds deterministically by the hash of each row's text (so
// a row keeps its fold when others are added or reordered) and returns, for fold i, the
// indices in it.
func Folds(rows []Row, k int) [][]int {
	out := make([][]int, k)
	for i, r := range rows {
		h := uint32(fnvOffset)
		for j := 0; j < len(r.Text); j++ {
			h = (h ^ uint32(r.Text[j])) * fnvPrime
		}
		f := int(mix(h) % uint32(k))
		out[f] = append(out[f], i)
	}
	return out
}
