package tokenize

import (
	"github.com/ardanlabs/jinja"
	"github.com/kvroute/kvroute/internal/jsonvalue"
)

// Chat templates see Python objects built by json.loads: dicts keep the client's key
// order, and `tojson` re-emits them in that order. jsonvalue.Value keeps that order (and
// each number's literal) from the one parse of the body; toJinja (tojson.go) converts
// it for the template engine.

// decodeOrdered parses one JSON text (a tool call's arguments string) as json.loads
// does and converts it for the template.
func decodeOrdered(data []byte) (jinja.Value, error) {
	v, err := jsonvalue.ParseValue(data)
	if err != nil {
		return jinja.Undefined(), err
	}
	return toJinja(v), nil
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
