package tokenize

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kvroute/kvroute/request"
)

// harmonyTools renders the developer message's tools section for OpenAI function
// tools (harmony's template_tools_section for the "functions" namespace).
func harmonyTools(tools []request.Value) (string, error) {
	var sb strings.Builder
	sb.WriteString("# Tools\n\n## functions\n\nnamespace functions {\n")
	for i, t := range tools {
		if typ, _ := t.Field("type").Str(); typ != "function" {
			return "", errHarmony("tools[%d]: type %q", i, typ)
		}
		fn := t.Field("function")
		name, ok := fn.Field("name").Str()
		if !ok {
			return "", errHarmony("tools[%d]: no name", i)
		}
		desc, ok := fn.Field("description").Str()
		if !ok {
			return "", errHarmony("tools[%d]: no description", i)
		}
		sb.WriteString("\n")
		for _, line := range rustLines(desc) {
			sb.WriteString("// " + line + "\n")
		}
		params := fn.Field("parameters")
		if params.Kind() == request.Null {
			sb.WriteString("type " + name + " = () => any;\n")
			continue
		}
		ts, err := schemaTS(params, "")
		if err != nil {
			return "", fmt.Errorf("tools[%d]: %w", i, err)
		}
		sb.WriteString("type " + name + " = (_: " + ts + ") => any;\n")
	}
	sb.WriteString("\n} // namespace functions")
	return sb.String(), nil
}

// schemaTS converts a JSON schema to harmony's TypeScript-like type
// (json_schema_to_typescript): objects list their properties (title, description and
// string examples as comments above, "?" when not required, nullable as "| null",
// default as a trailing comment), string enums as unions of quoted values, integer as
// number, arrays as T[] (Array<any> without items), a list of types as a union, and
// anything else as any. oneOf is refused.
func schemaTS(s request.Value, indent string) (string, error) {
	if _, ok := s.Get("oneOf"); ok {
		return "", errHarmony("schema with oneOf")
	}
	if types := s.Field("type"); types.Kind() == request.Array {
		var out []string
		for i := range types.Len() {
			if t, ok := types.Index(i).Str(); ok {
				if t == "integer" {
					t = "number"
				}
				out = append(out, t)
			}
		}
		if len(out) > 0 {
			return strings.Join(out, " | "), nil
		}
	}
	typ, ok := s.Field("type").Str()
	if !ok {
		return "any", nil
	}
	switch typ {
	case "object":
		var sb strings.Builder
		if d, ok := s.Field("description").Str(); ok {
			sb.WriteString(indent + "// " + d + "\n")
		}
		sb.WriteString("{\n")
		if props := s.Field("properties"); props.Kind() == request.Object {
			required := map[string]bool{}
			if req := s.Field("required"); req.Kind() == request.Array {
				for i := range req.Len() {
					if r, ok := req.Index(i).Str(); ok {
						required[r] = true
					}
				}
			}
			for _, p := range props.Members() {
				v := p.Value
				if _, ok := v.Get("oneOf"); ok {
					return "", errHarmony("property %q with oneOf", p.Key)
				}
				if t, ok := v.Field("title").Str(); ok {
					sb.WriteString(indent + "// " + t + "\n" + indent + "//\n")
				}
				if d, ok := v.Field("description").Str(); ok {
					sb.WriteString(indent + "// " + d + "\n")
				}
				if ex := v.Field("examples"); ex.Kind() == request.Array && ex.Len() > 0 {
					sb.WriteString(indent + "// Examples:\n")
					for i := range ex.Len() {
						if e, ok := ex.Index(i).Str(); ok {
							sb.WriteString(indent + "// - \"" + e + "\"\n")
						}
					}
				}
				opt := "?"
				if required[p.Key] {
					opt = ""
				}
				ts, err := schemaTS(v, indent+"    ")
				if err != nil {
					return "", err
				}
				if v.Field("nullable").Boolean() && !strings.Contains(ts, "null") {
					ts += " | null"
				}
				sb.WriteString(indent + p.Key + opt + ": " + ts + ",")
				if def, ok := v.Get("default"); ok {
					c, err := defaultComment(def, isEnum(v))
					if err != nil {
						return "", fmt.Errorf("property %q: %w", p.Key, err)
					}
					sb.WriteString(" // default: " + c)
				}
				sb.WriteString("\n")
			}
		}
		sb.WriteString(indent + "}")
		return sb.String(), nil
	case "string":
		if e := s.Field("enum"); e.Kind() == request.Array {
			var vals []string
			for i := range e.Len() {
				if v, ok := e.Index(i).Str(); ok {
					vals = append(vals, "\""+v+"\"")
				}
			}
			if len(vals) > 0 {
				return strings.Join(vals, " | "), nil
			}
		}
		return "string", nil
	case "number", "integer":
		return "number", nil
	case "boolean":
		return "boolean", nil
	case "array":
		if items, ok := s.Get("items"); ok {
			ts, err := schemaTS(items, indent)
			if err != nil {
				return "", err
			}
			return ts + "[]", nil
		}
		return "Array<any>", nil
	}
	return "any", nil
}

func isEnum(s request.Value) bool {
	e := s.Field("enum")
	return e.Kind() == request.Array && e.Len() > 0
}

// rustLines splits s as Rust's str::lines: on "\n", a trailing "\r" stripped from
// each line, no final empty line for a trailing newline, none at all for "".
func rustLines(s string) []string {
	if s == "" {
		return nil
	}
	s = strings.TrimSuffix(s, "\n")
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSuffix(l, "\r")
	}
	return lines
}

// defaultComment is a default value as harmony prints it: a string quoted unless the
// schema is an enum, integers, booleans and null as JSON. Other values (floats,
// arrays, objects: serde_json's formatting) are refused.
func defaultComment(v request.Value, enum bool) (string, error) {
	switch v.Kind() {
	case request.String:
		if enum {
			return v.Text(), nil
		}
		return "\"" + v.Text() + "\"", nil
	case request.Bool:
		if v.Boolean() {
			return "true", nil
		}
		return "false", nil
	case request.Null:
		return "null", nil
	case request.Number:
		if n, ok := v.Int(); ok && v.IsInt() {
			return fmt.Sprint(n), nil
		}
	}
	return "", errHarmony("default of kind %s", v.Kind())
}

var errOneOf = errors.New("oneOf")
