package app

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/router"
)

// AdminHandler returns the admin HTTP surface. Every route is registered here:
//
//	GET /metrics         Prometheus metrics
//	GET /healthz         liveness: 200 while the process runs
//	GET /readyz          readiness: 200 once servers run and at least one worker is healthy (ready.go)
//	GET /debug/workers   JSON: workers with bookings, scraped load, index mode and last KV event age; open in-flight tickets
//	GET /debug/index     JSON: KV index totals and per-worker summaries (?worker=NAME: one; ?limit=N≤1000&cursor=NAME: a page)
//	GET /debug/tokenize  JSON: each model's tokenizer, chat template, path health and shadow check; workers in remote backoff
//	POST /debug/tokenize/reset  return models the shadow check switched off their local path (to remote or load-only) to their paths (?model=NAME: one)
//	GET /debug/explain   JSON: per worker cached tokens, TTFT terms and the choice for a request body; books nothing (explain.go)
//	GET /debug/peers     JSON: peer replicas seen, their state's age, bytes exchanged, bookings imported (peers.go)
//	GET /debug/admission JSON: budget state per tenant (limits, current window's tokens and requests, concurrent), the QoS classes, queue depth per class with a queue; durations in seconds; no keys (debugadmission.go)
func (a *App) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.Gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", a.readyz)
	// /debug/* may need server.admin_token (debugAuth, servers.go).
	mux.HandleFunc("GET /debug/workers", a.debugAuth(a.debugWorkers))
	mux.HandleFunc("GET /debug/index", a.debugAuth(a.debugIndex))
	mux.HandleFunc("GET /debug/tokenize", a.debugAuth(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"models": a.Tokenize.Health(), "remote_workers": a.Tokenize.RemoteWorkers()})
	}))
	mux.HandleFunc("POST /debug/tokenize/reset", a.debugAuth(a.resetShadow))
	mux.HandleFunc("GET /debug/explain", a.debugAuth(a.debugExplain))
	mux.HandleFunc("GET /debug/peers", a.debugAuth(a.debugPeers))
	mux.HandleFunc("GET /debug/admission", a.debugAuth(a.debugAdmission))
	return mux
}

func (a *App) readyz(w http.ResponseWriter, _ *http.Request) {
	if ok, why := a.readiness(); !ok {
		http.Error(w, why, http.StatusServiceUnavailable)
		return
	}
	w.Write([]byte("ok\n"))
}

// workerView is one worker in GET /debug/workers: the router's view plus the health of
// its KV events, from the index's per-worker summary (taken after the router's lock is
// released, under the worker's index lock only long enough to copy counters).
type workerView struct {
	router.WorkerState
	IndexMode string `json:"index_mode"` // exact, approximate, none (kvroute_index_mode)
	KVEvents  bool   `json:"kv_events"`  // KV events expected
	// EventsFailing: its last stored events failed to apply (kvindex.FailingAfter in a row)
	EventsFailing bool `json:"kv_events_failing"`
	// LastEventAge is the time since its last KV event batch was applied, seconds;
	// null when none was.
	LastEventAge *float64 `json:"last_kv_event_age_s"`
}

func (a *App) debugWorkers(w http.ResponseWriter, _ *http.Request) {
	ws, ts := a.Router.Snapshot()
	out := make([]workerView, len(ws))
	for i, s := range ws {
		out[i] = workerView{WorkerState: s, IndexMode: kvindex.ModeNone.String()}
		if sum, ok := a.Index.Summary(s.Name); ok {
			out[i].IndexMode, out[i].KVEvents, out[i].EventsFailing, out[i].LastEventAge = sum.Mode, sum.Events, sum.Failing, sum.LastEventAge
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"workers": out, "in_flight": ts})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// resetShadow is POST /debug/tokenize/reset[?model=NAME]: it clears the shadow check's
// record of the model (all models without ?model) and returns a model it switched to
// the remote path to its configured paths.
func (a *App) resetShadow(w http.ResponseWriter, r *http.Request) {
	model := r.URL.Query().Get("model")
	if !a.Tokenize.ResetShadow(model) {
		if len(model) > 200 {
			model = model[:200] + "…"
		}
		writeJSON(w, http.StatusNotFound, map[string]any{"error": "no configured model " + strconv.Quote(model)})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"models": a.Tokenize.Health()})
}
