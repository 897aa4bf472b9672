package tokenize

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/ardanlabs/jinja"
)

// Chat templates see Python objects built by json.loads: dicts keep the client's key
// order, and `tojson` re-emits them in that order. Go maps lose it, so request bodies
// are re-decoded here into ordered jinja values.

// decodeOrdered decodes one JSON value keeping object key order. Numbers keep their
// integer/float distinction (json.Number).
func decodeOrdered(data []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return jinja.Undefined(), err
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			d := jinja.NewDict()
			dict := d.AsDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return jinja.Undefined(), err
				}
				k, _ := kt.(string)
				v, err := decodeValue(dec)
				if err != nil {
					return jinja.Undefined(), err
				}
				dict.Set(k, v) // a repeated key keeps its first position and the last value, as json.loads
			}
			_, err := dec.Token()
			return d, err
		case '[':
			var items []jinja.Value
			for dec.More() {
				v, err := decodeValue(dec)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, v)
			}
			_, err := dec.Token()
			if items == nil {
				items = []jinja.Value{}
			}
			return jinja.NewList(items), err
		}
		return jinja.Undefined(), fmt.Errorf("unexpected %v", t)
	default:
		return jinja.FromGoValue(tok), nil
	}
}

// fromGo converts decoded-map JSON (map[string]any, []any, float64, …) to a value, with
// object keys sorted: the fallback when no raw body is available.
func fromGo(v any) jinja.Value {
	switch x := v.(type) {
	case map[string]any:
		d := jinja.NewDict()
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			d.AsDict().Set(k, fromGo(x[k]))
		}
		return d
	case []map[string]any:
		items := make([]jinja.Value, len(x))
		for i, e := range x {
			items[i] = fromGo(e)
		}
		return jinja.NewList(items)
	case []any:
		items := make([]jinja.Value, len(x))
		for i, e := range x {
			items[i] = fromGo(e)
		}
		return jinja.NewList(items)
	case float64:
		if x == float64(int64(x)) && x < 1<<53 && x > -(1<<53) {
			return jinja.NewInt(int64(x))
		}
		return jinja.NewFloat(x)
	}
	return jinja.FromGoValue(v)
}

// get returns d[key] for a dict value, or Undefined.
func get(d jinja.Value, key string) jinja.Value {
	if !d.IsDict() {
		return jinja.Undefined()
	}
	v, ok := d.AsDict().Get(key)
	if !ok {
		return jinja.Undefined()
	}
	return v
}
