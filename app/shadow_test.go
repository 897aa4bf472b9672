package app

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/tokenize"
)

// syncBuffer is a log sink safe for the shadow goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// simWorker starts a vllm-sim worker on 127.0.0.1 whose /tokenize uses the real
// tokenizer in dir (as vllm-sim --tokenizer does), disagreeing on purpose when asked.
func simWorker(t *testing.T, dir string, disagree bool) string {
	t.Helper()
	m, err := tokenize.LoadModel(dir, tokenize.Options{})
	if err != nil {
		t.Fatal(err)
	}
	prof, err := sim.LookupProfile("l40s-27b")
	if err != nil {
		t.Fatal(err)
	}
	w, err := sim.NewWorker(sim.WorkerOptions{Profile: prof, Model: "m", TokenizeDisagree: disagree,
		TextTokens: func(chat bool, body []byte) ([]uint32, error) {
			api := request.APICompletions
			if chat {
				api = request.APIChat
			}
			req, err := request.Parse(api, body)
			if err != nil {
				return nil, err
			}
			ids, err := tokenize.LocalTokens(m, req)
			if err != nil {
				return nil, err
			}
			return ids[0], nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	return loopbackServer(t, w.ServeHTTP).Listener.Addr().String()
}

// TestShadowCheck (issue 13 item 2), end to end over loopback HTTP with vllm-sim
// workers: with an agreeing worker every check matches; with a worker whose /tokenize
// disagrees on purpose the mismatches are counted, the first is logged once with its
// position and without prompt text, and past the mismatch rate the model switches to
// its remote path (gauge, /debug/tokenize) until POST /debug/tokenize/reset.
func TestShadowCheck(t *testing.T) {
	dir := filepath.Join("..", ".cache", "tokenizers", "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s missing under CI (make test fetches it)", dir)
		}
		t.Skipf("%s missing: run make tokenizers", dir)
	}
	const secret = "SECRET-PROMPT-TEXT"
	newApp := func(addr string, logs *syncBuffer) *App {
		cfg := config.Default()
		cfg.Models = []config.Model{{Name: "m", Tokenizer: dir}}
		cfg.Workers = []config.Worker{{Name: "w", Address: addr}}
		cfg.Tokenize.Shadow = config.TokenizeShadow{Fraction: 1, MaxPerSecond: 1000, MinChecks: 5, MismatchRate: 0.5}
		a, err := New(&cfg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	pick := func(a *App, i int) *router.Ticket {
		body := `{"model":"m","prompt":"` + secret + ` number ` + strings.Repeat("x", i) + ` and some more words"}`
		req, err := request.Parse(request.APICompletions, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		tk, err := a.Router.Pick(context.Background(), req, router.PickOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tk.Abort()
		return tk
	}
	health := func(a *App) tokenize.ShadowHealth { return shadowHealth(t, a) }
	checks := func(a *App, result string) float64 {
		return testutil.ToFloat64(a.Metrics.Tokenize.ShadowChecks.WithLabelValues("m", result))
	}

	// An agreeing worker: every request checked, every check a match.
	var logs1 syncBuffer
	a := newApp(simWorker(t, dir, false), &logs1)
	for i := range 8 {
		if tk := pick(a, i); tk.Path != tokenize.PathLocal {
			t.Fatalf("pick %d: path %s, want local", i, tk.Path)
		}
		a.Tokenize.WaitShadow() // at most 4 checks run at once; more are dropped
	}
	if got := checks(a, tokenize.ShadowMatch); got != 8 || checks(a, tokenize.ShadowMismatch) != 0 {
		t.Errorf("agreeing worker: %v matches, %v mismatches; want 8, 0", got, checks(a, tokenize.ShadowMismatch))
	}
	if h := health(a); h.Remote || h.Matches != 8 || !h.Enabled {
		t.Errorf("agreeing worker: shadow health %+v", h)
	}

	// A worker whose /tokenize disagrees: 5 checks (min_checks) all mismatch → remote.
	var logs2 syncBuffer
	a = newApp(simWorker(t, dir, true), &logs2)
	for i := range 5 {
		pick(a, i)
		a.Tokenize.WaitShadow() // one at a time: the switch comes after exactly 5
	}
	if got := checks(a, tokenize.ShadowMismatch); got != 5 {
		t.Errorf("disagreeing worker: %v mismatches, want 5", got)
	}
	h := health(a)
	if !h.Remote || h.Mismatches != 5 || h.LastDiffPos < 0 || h.LastLocal != h.LastRemote || h.LastDiffPos != h.LastLocal-1 {
		t.Errorf("disagreeing worker: shadow health %+v, want remote with the last id differing", h)
	}
	if g := testutil.ToFloat64(a.Metrics.Tokenize.ShadowRemote.WithLabelValues("m")); g != 1 {
		t.Errorf("shadow_remote gauge = %v, want 1", g)
	}
	if tk := pick(a, 9); tk.Path != tokenize.PathRemote {
		t.Errorf("after the switch: path %s, want remote", tk.Path)
	}
	a.Tokenize.WaitShadow()
	if got := checks(a, tokenize.ShadowMismatch) + checks(a, tokenize.ShadowMatch); got != 5 {
		t.Errorf("remote-path requests must not be shadow checked: %v checks", got)
	}
	out := logs2.String()
	if n := strings.Count(out, "local token ids differ"); n != 1 {
		t.Errorf("mismatch logged %d times, want once:\n%s", n, out)
	}
	if !strings.Contains(out, "first_difference=") || strings.Contains(out, secret) {
		t.Errorf("mismatch log must give the position and no prompt text:\n%s", out)
	}

	// The admin reset returns the model to its local path.
	rec := httptest.NewRecorder()
	a.AdminHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/debug/tokenize/reset?model=m", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("reset: %d %s", rec.Code, rec.Body)
	}
	if h := health(a); h.Remote || h.Mismatches != 0 {
		t.Errorf("after reset: %+v", h)
	}
	if g := testutil.ToFloat64(a.Metrics.Tokenize.ShadowRemote.WithLabelValues("m")); g != 0 {
		t.Errorf("shadow_remote gauge after reset = %v, want 0", g)
	}
	if tk := pick(a, 10); tk.Path != tokenize.PathLocal {
		t.Errorf("after reset: path %s, want local", tk.Path)
	}
	a.Tokenize.WaitShadow()
	rec = httptest.NewRecorder()
	a.AdminHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/debug/tokenize/reset?model=nope", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("reset of an unknown model: %d, want 404", rec.Code)
	}
}

// The shadow check's load-only fallback, end to end over loopback HTTP: a model whose
// local tokenizer is of another family (llama3's tokenizer.json for a worker that runs
// qwen3, as vllm-sim --tokenizer does) and that has no remote path (tokenize_paths:
// [local]). Past the mismatch rate its requests are picked on load alone (no ids: path
// none, reason local_shadow_mismatch), said once in the log, in /debug/tokenize
// (load_only) and by kvroute_tokenize_shadow_load_only, never by the remote gauge;
// the admin reset returns it to its local path.
func TestShadowLoadOnlyFallback(t *testing.T) {
	engineDir := filepath.Join("..", ".cache", "tokenizers", "qwen3")
	wrongDir := filepath.Join("..", ".cache", "tokenizers", "llama3")
	for _, d := range []string{engineDir, wrongDir} {
		if _, err := os.Stat(filepath.Join(d, "tokenizer.json")); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s missing under CI (make test fetches it)", d)
			}
			t.Skipf("%s missing: run make tokenizers", d)
		}
	}
	var logs syncBuffer
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", Tokenizer: wrongDir, TokenizePaths: []string{"local"}}}
	cfg.Workers = []config.Worker{{Name: "w", Address: simWorker(t, engineDir, false)}}
	cfg.Tokenize.Shadow = config.TokenizeShadow{Fraction: 1, MaxPerSecond: 1000, MinChecks: 5, MismatchRate: 0.5}
	a, err := New(&cfg, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if err != nil {
		t.Fatal(err)
	}
	pick := func(i int) *router.Ticket {
		req, err := request.Parse(request.APICompletions, []byte(`{"model":"m","prompt":"the cache `+strings.Repeat("word ", i+1)+`is shared"}`))
		if err != nil {
			t.Fatal(err)
		}
		tk, err := a.Router.Pick(context.Background(), req, router.PickOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tk.Abort()
		a.Tokenize.WaitShadow()
		return tk
	}
	health := func() tokenize.ShadowHealth { return shadowHealth(t, a) }
	gauge := func(g interface {
		WithLabelValues(...string) prometheus.Gauge
	}) float64 {
		return testutil.ToFloat64(g.WithLabelValues("m"))
	}
	for i := range 5 {
		if tk := pick(i); tk.Path != tokenize.PathLocal {
			t.Fatalf("pick %d before the switch: path %s, want local", i, tk.Path)
		}
	}
	if got := testutil.ToFloat64(a.Metrics.Tokenize.ShadowChecks.WithLabelValues("m", tokenize.ShadowMismatch)); got != 5 {
		t.Fatalf("%v mismatches of llama3 ids against a qwen3 engine, want 5", got)
	}
	if h := health(); !h.LoadOnly || h.Remote || h.SwitchedAt.IsZero() {
		t.Fatalf("shadow health %+v, want load_only", h)
	}
	if gauge(a.Metrics.Tokenize.ShadowLoadOnly) != 1 || gauge(a.Metrics.Tokenize.ShadowRemote) != 0 {
		t.Fatalf("gauges: load_only %v remote %v, want 1, 0", gauge(a.Metrics.Tokenize.ShadowLoadOnly), gauge(a.Metrics.Tokenize.ShadowRemote))
	}
	for i := 5; i < 8; i++ {
		if tk := pick(i); tk.Path != tokenize.PathNone || tk.Degraded != "local_shadow_mismatch" {
			t.Fatalf("pick %d after the switch: path %s (%s), want none (local_shadow_mismatch)", i, tk.Path, tk.Degraded)
		}
	}
	if got := testutil.ToFloat64(a.Metrics.Tokenize.Degraded.WithLabelValues("m", "local_shadow_mismatch")); got != 3 {
		t.Errorf("degraded{local_shadow_mismatch} = %v, want 3", got)
	}
	if n := strings.Count(logs.String(), "no remote tokenization path"); n != 1 {
		t.Errorf("load-only switch logged %d times, want once:\n%s", n, logs.String())
	}
	rec := httptest.NewRecorder()
	a.AdminHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/debug/tokenize/reset?model=m", nil))
	if h := health(); rec.Code != http.StatusOK || h.LoadOnly || gauge(a.Metrics.Tokenize.ShadowLoadOnly) != 0 {
		t.Fatalf("after reset: %d %+v", rec.Code, h)
	}
	if tk := pick(9); tk.Path != tokenize.PathLocal {
		t.Errorf("after reset: path %s, want local", tk.Path)
	}
}

// shadowHealth reads the one model's shadow record from GET /debug/tokenize.
func shadowHealth(t *testing.T, a *App) tokenize.ShadowHealth {
	t.Helper()
	rec := httptest.NewRecorder()
	a.AdminHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/tokenize", nil))
	var out struct {
		Models []struct {
			Shadow tokenize.ShadowHealth `json:"shadow"`
		} `json:"models"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || len(out.Models) != 1 {
		t.Fatalf("/debug/tokenize: %v %s", err, rec.Body)
	}
	return out.Models[0].Shadow
}
