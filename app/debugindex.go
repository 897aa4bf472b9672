package app

import (
	"net/http"
	"sort"
	"strconv"

	"github.com/kvroute/kvroute/kvindex"
)

// Debug index listing bounds: a page lists at most debugIndexMaxLimit workers.
const (
	debugIndexDefaultLimit = 100
	debugIndexMaxLimit     = 1000
)

// debugIndex serves GET /debug/index: with ?worker=NAME that worker's index summary
// (404 when unknown), without it the totals and one page of worker summaries, sorted
// by name: ?limit=N (default 100, at most 1000) workers after ?cursor=NAME (the
// previous page's next_cursor; "" = from the start). next_cursor is "" on the last
// page. Each summary copies a bounded set of counters under its worker's lock (see
// kvindex.Index.Summary), so listing never holds a lock routing needs for longer than
// that copy, however large the index.
func (a *App) debugIndex(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if name := q.Get("worker"); name != "" {
		s, ok := a.Index.Summary(name)
		if !ok {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "unknown worker " + truncate(name, 256)})
			return
		}
		writeJSON(w, http.StatusOK, s)
		return
	}
	limit := debugIndexDefaultLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > debugIndexMaxLimit {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "limit must be an integer in 1.." + strconv.Itoa(debugIndexMaxLimit)})
			return
		}
		limit = n
	}
	cursor := q.Get("cursor")
	names := a.Index.Workers()
	sort.Strings(names)
	i := sort.SearchStrings(names, cursor)
	if i < len(names) && names[i] == cursor {
		i++ // the cursor is the last name of the previous page
	}
	page := names[i:min(i+limit, len(names))]
	ws := make([]kvindex.WorkerSummary, 0, len(page))
	for _, n := range page {
		if s, ok := a.Index.Summary(n); ok {
			ws = append(ws, s)
		}
	}
	next := ""
	if i+len(page) < len(names) && len(page) > 0 {
		next = page[len(page)-1]
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": a.Index.Entries(), "keys": a.Index.Keys(),
		"bytes": a.Index.Bytes(), "workers_total": len(names), "workers": ws, "next_cursor": next})
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
