package app

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
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
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, Listeners{}) }()
	<-a.Ready()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}
