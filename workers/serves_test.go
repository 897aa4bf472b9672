package workers

import "testing"

// A worker configured without models (and no models section) must accept any model,
// otherwise a workers-only configuration answers 404 to everything.
func TestServesAnyModelWhenUnlisted(t *testing.T) {
	any := &Worker{Name: "w", Address: "127.0.0.1:1"}
	one := &Worker{Name: "v", Address: "127.0.0.1:2", Models: []string{"m"}}
	if !any.Serves("whatever") {
		t.Error("a worker without models must serve any model")
	}
	if one.Serves("other") || !one.Serves("m") {
		t.Error("a worker with models serves exactly those")
	}
	r := NewRegistry()
	r.Set([]*Worker{any, one})
	got, known := r.Candidates("x", nil)
	if !known || len(got) != 1 || got[0].Name != "w" {
		t.Fatalf("Candidates(x) = %v, %v; want only the unlisted worker", got, known)
	}
}
