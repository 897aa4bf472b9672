package request

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
)

// decodeError turns an encoding/json error into a client-facing *Error that names the
// JSON field and the expected JSON type, never Go types or struct names (the shape of
// OpenAI's and vLLM's validation errors: "field 'messages' must be an array of objects,
// got string"). root is the JSON path of the decoded value ("" for the whole body).
func decodeError(err error, root string) *Error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := te.Field
		if root != "" {
			field = strings.TrimSuffix(root+"."+field, ".")
		}
		got := te.Value // "string", "bool", "array", "object", "number", "number 1.5"
		if field == "" {
			return invalid("", "request body must be a JSON object, got %s", got)
		}
		// A wrong element of an array reports the element's Go type under the array's
		// path (encoding/json adds no indices): name the array's type instead.
		arr := te.Type
		if root != "" && te.Field == "" && te.Type.Kind() != reflect.Slice {
			arr = reflect.SliceOf(te.Type) // the value at root is always an array here (tools)
		} else if ft, ok := wireField(field); ok && root == "" {
			arr = ft
		}
		if arr.Kind() == reflect.Slice && arr.Elem() == te.Type {
			return invalid(field, "field '%s' must be %s, got an element of type %s", field, jsonKind(arr), got)
		}
		return invalid(field, "field '%s' must be %s, got %s", field, jsonKind(te.Type), got)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return invalid(root, "request body is not valid JSON: %s (at byte %d)", se.Error(), se.Offset)
	}
	return invalid(root, "request body is not valid JSON")
}

// wireField returns the Go type of wire's top-level field with JSON name name.
func wireField(name string) (reflect.Type, bool) {
	wt := reflect.TypeOf(wire{})
	for i := range wt.NumField() {
		f := wt.Field(i)
		if tag, _, _ := strings.Cut(f.Tag.Get("json"), ","); tag == name {
			return f.Type, true
		}
	}
	return nil, false
}

// jsonKind names the JSON type a Go type decodes from, with an article.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		switch e := jsonKind(t.Elem()); e {
		case "an object":
			return "an array of objects"
		case "an integer":
			return "an array of integers"
		case "a string":
			return "an array of strings"
		default:
			return "an array"
		}
	}
	return "a JSON value"
}
