package app

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/testrun"
	"github.com/kvroute/kvroute/kvindex"
)

func TestDebugIndexAndKVEventsLifecycle(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", BlockSize: 4}}
	cfg.Workers = []config.Worker{{Name: "w1", Address: "127.0.0.1:8001"}}
	a, err := New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	keys := kvindex.HashBlocks(kvindex.Namespace{Model: "m"}.Seed(), []uint32{1, 2, 3, 4, 5, 6, 7, 8}, 4, nil)
	a.Index.Speculate("w1", keys)
	srv := httptest.NewServer(a.AdminHandler())
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/debug/index?worker=w1")
	if err != nil {
		t.Fatal(err)
	}
	var s kvindex.WorkerSummary
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d err %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if s.Worker != "w1" || s.Model != "m" || s.Speculative != 2 || s.Mode != "approximate" {
		t.Fatalf("summary %+v: a worker without KV events runs approximate on its speculative entries", s)
	}
	resp, _ = http.Get(srv.URL + "/debug/index?worker=nope")
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown worker: %d", resp.StatusCode)
	}
	resp.Body.Close()

	// Run starts the subscriber manager and returns on cancel.
	testrun.Start(t, a, Listeners{})() // stop: Run must return nil after the cancel
}

// Issue 10 item 3: the listing is paginated (limit ≤ 1000, cursor = the previous page's
// last worker) and every page is built from bounded per-worker copies
// (kvindex.TestSummaryCopiesBoundedState).
func TestDebugIndexPaginates(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", BlockSize: 4}}
	a, err := New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"w3", "w1", "w5", "w2", "w4"} {
		a.Index.SetWorker(kvindex.WorkerInfo{Name: n, Model: "m"})
	}
	srv := httptest.NewServer(a.AdminHandler())
	defer srv.Close()
	type page struct {
		Workers      []kvindex.WorkerSummary `json:"workers"`
		WorkersTotal int                     `json:"workers_total"`
		NextCursor   string                  `json:"next_cursor"`
	}
	get := func(q string) (int, page) {
		resp, err := http.Get(srv.URL + "/debug/index" + q)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var p page
		_ = json.NewDecoder(resp.Body).Decode(&p)
		return resp.StatusCode, p
	}
	var seen []string
	cursor := ""
	for i := 0; i < 10; i++ {
		code, p := get("?limit=2&cursor=" + cursor)
		if code != 200 || p.WorkersTotal != 5 || len(p.Workers) > 2 {
			t.Fatalf("page %d: %d %+v", i, code, p)
		}
		for _, w := range p.Workers {
			seen = append(seen, w.Worker)
		}
		if cursor = p.NextCursor; cursor == "" {
			break
		}
	}
	if fmt.Sprint(seen) != "[w1 w2 w3 w4 w5]" {
		t.Fatalf("pages listed %v", seen)
	}
	if _, p := get(""); len(p.Workers) != 5 || p.NextCursor != "" {
		t.Fatalf("default page: %+v", p)
	}
	for _, q := range []string{"?limit=0", "?limit=1001", "?limit=x"} {
		if code, _ := get(q); code != http.StatusBadRequest {
			t.Fatalf("%s: status %d, want 400", q, code)
		}
	}
}
