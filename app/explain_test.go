package app

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/kvindex"
)

func explainApp(t *testing.T, policy string) *App {
	t.Helper()
	cfg := config.Default()
	cfg.Scoring.Policy = policy
	cfg.Models = []config.Model{{Name: "m", BlockSize: 16}}
	cfg.Workers = []config.Worker{{Name: "a", Address: "127.0.0.1:9001"}, {Name: "b", Address: "127.0.0.1:9002"}}
	a, err := New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func explain(t *testing.T, a *App, target, body string, hdr map[string]string) (*httptest.ResponseRecorder, ExplainResponse) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, target, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	a.AdminHandler().ServeHTTP(rec, req)
	var out ExplainResponse
	if rec.Code == http.StatusOK {
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
			t.Fatalf("explain body is not JSON: %v\n%s", err, rec.Body)
		}
	}
	return rec, out
}

func TestExplainShowsTermsAndBooksNothing(t *testing.T) {
	a := explainApp(t, "kvroute")
	ids := make([]string, 64)
	toks := make([]uint32, 64)
	for i := range ids {
		ids[i] = "1" + strings.Repeat("0", i%3)
		toks[i] = uint32(map[int]uint32{0: 1, 1: 10, 2: 100}[i%3])
	}
	keys := kvindex.HashBlocks(kvindex.Namespace{Model: "m"}.Seed(), toks, 16, nil)
	a.Index.Store("b", kvindex.TierGPU, keys[:3]) // b holds 48 of the 64 tokens
	body := `{"model":"m","prompt":[` + strings.Join(ids, ",") + `]}`
	rec, out := explain(t, a, "/debug/explain?path=/v1/completions", body, map[string]string{"x-slo-ttft-ms": "500"})
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if out.Policy != "kvroute" || out.PromptTokens != 64 || out.Tokenization == "" || out.SLOSeconds != 0.5 || len(out.Workers) != 2 {
		t.Fatalf("explain header fields: %+v", out)
	}
	wa, wb := out.Workers[0], out.Workers[1]
	if wa.Worker != "a" || wb.Worker != "b" || wb.CachedTokens != 48 || wb.CachedBlocks["gpu"] != 3 || wa.CachedTokens != 0 {
		t.Fatalf("per-worker cache view wrong: %+v", out.Workers)
	}
	if !(wb.PrefillSeconds < wa.PrefillSeconds && wb.PredictedTTFT < wa.PredictedTTFT && wa.OverheadSeconds > 0) {
		t.Fatalf("terms must show b's cache advantage: %+v", out.Workers)
	}
	if out.Chosen != "b" || !wb.Chosen || wa.Chosen || out.Reason == "" {
		t.Fatalf("choice: %+v", out)
	}
	if a.Router.InFlight() != 0 {
		t.Fatal("explain must not book anything")
	}
	for _, m := range a.Index.Lookup(keys, nil) {
		if m.Worker == "b" && m.Blocks > 3 || m.Worker == "a" {
			t.Fatalf("explain must not speculate index entries: %+v", m)
		}
	}
}

func TestExplainDefaultsToChatAndDegrades(t *testing.T) {
	a := explainApp(t, "kvroute")
	rec, out := explain(t, a, "/debug/explain", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
	if rec.Code != http.StatusOK || out.API != "chat" || out.Degraded == "" || out.Reason != "degraded" {
		t.Fatalf("chat without a tokenizer must explain a degraded, load-only pick: %d %+v", rec.Code, out)
	}
	// Header selects the API too.
	rec, out = explain(t, a, "/debug/explain", `{"model":"m","prompt":[1,2,3]}`, map[string]string{ExplainPathHeader: "/v1/completions"})
	if rec.Code != http.StatusOK || out.API != "completions" || out.PromptTokens != 3 {
		t.Fatalf("X-Kvroute-Path must select the API: %d %+v", rec.Code, out)
	}
}

func TestExplainErrors(t *testing.T) {
	a := explainApp(t, "round_robin")
	for _, tc := range []struct {
		name, target, body string
		hdr                map[string]string
		status             int
	}{
		{"empty body", "/debug/explain", "", nil, http.StatusBadRequest},
		{"bad json", "/debug/explain", "{", nil, http.StatusBadRequest},
		{"unknown model", "/debug/explain", `{"model":"x","messages":[{"role":"user","content":"hi"}]}`, nil, http.StatusNotFound},
		{"bad slo", "/debug/explain", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, map[string]string{"x-slo-ttft-ms": "soon"}, http.StatusBadRequest},
	} {
		rec, _ := explain(t, a, tc.target, tc.body, tc.hdr)
		if rec.Code != tc.status || !strings.Contains(rec.Body.String(), `"error"`) {
			t.Errorf("%s: status %d body %s, want %d with an OpenAI error", tc.name, rec.Code, rec.Body, tc.status)
		}
	}
	// A baseline without predictions still explains, and a dry run does not advance it.
	for i := 0; i < 3; i++ {
		_, out := explain(t, a, "/debug/explain", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
		if out.Chosen != "a" || out.Policy != "round_robin" {
			t.Fatalf("explain of round robin must not advance it: %+v", out)
		}
	}
}

// On a pool with prefill/decode roles the explain view shows the pair pick: a long
// prompt's prefill worker, decode worker, the remote decision and its transfer time; a
// short prompt's local prefill on the decode worker.
func TestExplainShowsThePair(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", BlockSize: 16}}
	cfg.Workers = []config.Worker{{Name: "d0", Address: "127.0.0.1:9001", Role: "decode"},
		{Name: "p0", Address: "127.0.0.1:9002", Role: "prefill"}}
	a, err := New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	prompt := func(n int) string {
		return `{"model":"m","prompt":[` + strings.TrimSuffix(strings.Repeat("7,", n), ",") + `]}`
	}
	rec, out := explain(t, a, "/debug/explain?path=/v1/completions", prompt(8192), nil)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	p := out.Pair
	if p == nil || p.PrefillWorker != "p0" || p.DecodeWorker != "d0" || p.Decision != "remote" || out.Chosen != "d0" {
		t.Fatalf("long prompt: pair %+v chosen %q, want p0 → d0 remote", p, out.Chosen)
	}
	if p.TransferSeconds <= 0 || p.PredictedTTFT <= p.TransferSeconds || p.PrefillPredictedTTFT <= 0 ||
		p.PredictedTTFT-p.TransferSeconds-p.PrefillPredictedTTFT > 1e-9 {
		t.Fatalf("long prompt: pair prediction %+v, want the leg plus the transfer", p)
	}
	if out.Workers[0].Role != "decode" || out.Workers[1].Role != "prefill" {
		t.Fatalf("roles %+v", out.Workers)
	}
	_, out = explain(t, a, "/debug/explain?path=/v1/completions", prompt(64), nil)
	if p := out.Pair; p == nil || p.PrefillWorker != "" || p.DecodeWorker != "d0" || p.Decision != "local" || p.TransferSeconds != 0 {
		t.Fatalf("short prompt: pair %+v, want d0 prefilling locally", p)
	}
	if _, agg := explain(t, explainApp(t, "kvroute"), "/debug/explain", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil); agg.Pair != nil {
		t.Fatalf("aggregated pool shows a pair %+v", agg.Pair)
	}
}
