package app

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/config"
)

// GET /debug/tokenize shows each configured model's paths, with why the local path is
// unavailable when its tokenizer did not load.
func TestDebugTokenize(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", Tokenizer: filepath.Join(t.TempDir(), "absent"), TokenizePaths: []string{"local", "remote"}}}
	cfg.Workers = []config.Worker{{Name: "a", Address: "127.0.0.1:9001"}}
	a, err := New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	a.AdminHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/tokenize", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d", rec.Code)
	}
	var out struct {
		Models []struct {
			Model string `json:"model"`
			Paths []struct {
				Path      string `json:"path"`
				Available bool   `json:"available"`
				Detail    string `json:"detail"`
			} `json:"paths"`
		} `json:"models"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	// The cache object uses snake_case names, and the document is indented like the
	// other debug routes.
	var raw struct {
		Models []struct {
			Cache map[string]any `json:"cache"`
		} `json:"models"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil || len(raw.Models) != 1 {
		t.Fatalf("%v %s", err, rec.Body)
	}
	for _, k := range []string{"hits", "misses", "hit_text_bytes", "miss_text_bytes", "evictions", "bytes", "entries"} {
		if _, ok := raw.Models[0].Cache[k]; !ok || len(raw.Models[0].Cache) != 7 {
			t.Errorf("cache object %v: want exactly the snake_case keys, missing %q", raw.Models[0].Cache, k)
		}
	}
	if !strings.HasPrefix(rec.Body.String(), "{\n  \"models\"") || rec.Header().Get("Content-Type") != "application/json" {
		t.Errorf("want indented JSON, got %q", rec.Body.String()[:min(40, rec.Body.Len())])
	}
	if len(out.Models) != 1 || len(out.Models[0].Paths) != 2 {
		t.Fatalf("body %s", rec.Body)
	}
	if p := out.Models[0].Paths[0]; p.Path != "local" || p.Available || p.Detail == "" {
		t.Errorf("local path %+v: want unavailable with the load error", p)
	}
	if p := out.Models[0].Paths[1]; p.Path != "remote" || !p.Available {
		t.Errorf("remote path %+v: want available (workers are registered)", p)
	}
}
