package app

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/config"
)

// reservedAdmission builds an App from cfg whose admission stage runs on a fixed clock
// (no budget window ends mid-test), reserves 100 prompt + 20 output tokens for the
// request in, and returns GET /debug/admission's body (status 200).
func reservedAdmission(t *testing.T, cfg config.Config, in admission.Input) []byte {
	t.Helper()
	a, err := New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Admission, err = admission.New(admission.Options{Config: cfg.Admission, Metrics: a.Metrics,
		Now: func() time.Time { return time.Date(2026, 1, 1, 12, 0, 30, 0, time.UTC) }}); err != nil {
		t.Fatal(err)
	}
	id, _ := a.Admission.Identify(in)
	if _, err := a.Admission.Reserve(id, admission.Want{PromptTokens: 100, MaxTokens: 20}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.AdminHandler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/debug/admission")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/debug/admission: %d %s", resp.StatusCode, raw)
	}
	return raw
}

// /debug/admission shows each tenant's limits and window state, never a key or its hash.
func TestDebugAdmission(t *testing.T) {
	sum := sha256.Sum256([]byte("sk-secret-key"))
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte(hex.EncodeToString(sum[:])+" acme\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Admission.Identity = []string{"api_key"}
	cfg.Admission.APIKeysFile = keys
	cfg.Admission.Tenants = []config.TenantLimits{{Name: "acme", Limits: config.Limits{TokensPerMinute: 5000}}}
	raw := reservedAdmission(t, cfg, admission.Input{Header: func(k string) string {
		if k == "authorization" {
			return "Bearer sk-secret-key"
		}
		return ""
	}})
	var out struct {
		Tenants []admission.TenantState `json:"tenants"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%v %s", err, raw)
	}
	if len(out.Tenants) != 1 || out.Tenants[0].Tenant != "acme" || out.Tenants[0].WindowTokens != 120 ||
		out.Tenants[0].Concurrent != 1 || out.Tenants[0].Limits.TokensPerMinute != 5000 {
		t.Fatalf("%s", raw)
	}
	if strings.Contains(string(raw), "sk-secret") || strings.Contains(string(raw), hex.EncodeToString(sum[:])[:16]) {
		t.Fatalf("a key or its hash leaked: %s", raw)
	}
}

// A missing API key file fails start with an error naming the file, not a key.
func TestAdmissionKeyFileMissing(t *testing.T) {
	cfg := config.Default()
	cfg.Admission.Identity = []string{"api_key"}
	cfg.Admission.APIKeysFile = filepath.Join(t.TempDir(), "nope")
	if _, err := New(&cfg, nil); err == nil || !strings.Contains(err.Error(), "api key file") {
		t.Fatalf("want a start error, got %v", err)
	}
}

// /debug/admission prints durations as seconds, in *_seconds fields (as its
// window_seconds), never as time.Duration's integer nanoseconds.
func TestDebugAdmissionSeconds(t *testing.T) {
	cfg := config.Default()
	cfg.Admission.Identity = []string{"header"}
	cfg.Admission.Tenants = []config.TenantLimits{{Name: "acme", Limits: config.Limits{TokensPerMinute: 5000,
		TokenWindows: []config.TokenWindow{{Window: 24 * time.Hour, Tokens: 5_000_000}}}}}
	cfg.Admission.Classes = []config.Class{{Name: "chat", Priority: 10, TTFTObjective: 1500 * time.Millisecond,
		QueueLimit: 4, MaxQueueTime: 2 * time.Second, OnSLOMiss: config.SLOMissRefuse}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	raw := reservedAdmission(t, cfg, admission.Input{EdgeHeaders: true, Header: func(k string) string {
		if k == cfg.Admission.TenantHeader {
			return "acme"
		}
		return ""
	}})
	var out struct {
		Tenants []map[string]any `json:"tenants"`
		Classes []map[string]any `json:"classes"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%v %s", err, raw)
	}
	if len(out.Classes) != 1 || out.Classes[0]["ttft_objective_seconds"] != 1.5 || out.Classes[0]["max_queue_time_seconds"] != 2.0 ||
		out.Classes[0]["queue_limit"] != 4.0 || out.Classes[0]["name"] != "chat" {
		t.Fatalf("classes: %s", raw)
	}
	if _, ok := out.Classes[0]["ttft_objective"]; ok {
		t.Fatalf("the nanosecond field is still there: %s", raw)
	}
	if len(out.Tenants) != 1 || out.Tenants[0]["tenant"] != "acme" || out.Tenants[0]["window_tokens"] != 120.0 {
		t.Fatalf("tenants: %s", raw)
	}
	lim, _ := out.Tenants[0]["limits"].(map[string]any)
	ws, _ := lim["token_windows"].([]any)
	if lim["tokens_per_minute"] != 5000.0 || len(ws) != 1 {
		t.Fatalf("limits: %s", raw)
	}
	if w, _ := ws[0].(map[string]any); w["window_seconds"] != 86400.0 || w["tokens"] != 5e6 {
		t.Fatalf("token window: %s", raw)
	}
}
