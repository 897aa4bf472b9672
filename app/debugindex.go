package app

import (
	"net/http"
	"sort"

	"github.com/kvroute/kvroute/kvindex"
)

// debugIndex serves GET /debug/index: with ?worker=NAME that worker's index summary
// (404 when unknown), without it the totals and every worker's summary.
func (a *App) debugIndex(w http.ResponseWriter, r *http.Request) {
	if name := r.URL.Query().Get("worker"); name != "" {
		s, ok := a.Index.Summary(name)
		if !ok {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "unknown worker " + name})
			return
		}
		writeJSON(w, http.StatusOK, s)
		return
	}
	names := a.Index.Workers()
	sort.Strings(names)
	ws := make([]kvindex.WorkerSummary, 0, len(names))
	for _, n := range names {
		if s, ok := a.Index.Summary(n); ok {
			ws = append(ws, s)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": a.Index.Entries(), "keys": a.Index.Keys(),
		"bytes": a.Index.Bytes(), "workers": ws})
}
