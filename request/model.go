package request

import "github.com/kvroute/kvroute/internal/jsonvalue"

// WithModel returns body with its top-level "model" member set to model, and whether
// it could: the other members keep their order and values (a repeated key is written
// once, at its first place, as json.loads reads it; a body without "model" gets it
// last).
// A body that does not parse as a JSON object (maxElems bounds each array, 0 none) is
// returned as it is, with false. The caller sets Request.Model to match, so that
// routing picks among the new model's workers.
func WithModel(body []byte, model string, maxElems int) ([]byte, bool) {
	root, err := jsonvalue.ParseValueLimit(body, maxElems)
	if err != nil || root.Kind() != jsonvalue.Object {
		return body, false
	}
	old := root.Members()
	out := make([]jsonvalue.Member, len(old), len(old)+1)
	copy(out, old)
	found := false
	for i := range out {
		if out[i].Key == "model" {
			out[i].Value, found = jsonvalue.StringValue(model), true
		}
	}
	if !found {
		out = append(out, jsonvalue.Member{Key: "model", Value: jsonvalue.StringValue(model)})
	}
	return jsonvalue.ObjectValue(out...).AppendJSON(nil), true
}
