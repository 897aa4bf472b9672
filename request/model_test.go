package request

import "testing"

// WithModel replaces the top-level model only, keeping the other members' order and
// bytes; a body that is not an object is returned as it is.
func TestWithModel(t *testing.T) {
	for _, c := range []struct {
		name, in, want string
		ok             bool
	}{
		{"chat", `{"model":"big","messages":[{"role":"user","content":"model"}],"n":1.50}`, `{"model":"small","messages":[{"role":"user","content":"model"}],"n":1.50}`, true},
		{"nested untouched", `{"extra":{"model":"x"},"model":"big"}`, `{"extra":{"model":"x"},"model":"small"}`, true},
		{"repeated", `{"model":"a","prompt":"p","model":"b"}`, `{"model":"small","prompt":"p"}`, true},
		{"absent", `{"prompt":"p"}`, `{"prompt":"p","model":"small"}`, true},
		{"not an object", `["model"]`, `["model"]`, false},
		{"not JSON", `{"model":`, `{"model":`, false},
	} {
		got, ok := WithModel([]byte(c.in), "small", 0)
		if string(got) != c.want || ok != c.ok {
			t.Errorf("%s: %s (%v), want %s (%v)", c.name, got, ok, c.want, c.ok)
		}
		if ok {
			if r, err := Parse(APICompletions, got); err == nil && r.Model != "small" {
				t.Errorf("%s: parsed model %q", c.name, r.Model)
			}
		}
	}
}
