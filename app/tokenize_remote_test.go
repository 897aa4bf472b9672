package app

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/tokenize"
)

// loopbackServer serves h on 127.0.0.1.
func loopbackServer(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &httptest.Server{Listener: ln, Config: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// TestRemoteTokenizeHungWorker (issue 10 item 6): one hung worker must not disable
// remote tokenization for its model. Every request is served by the other worker's
// /tokenize (the hung one is tried, times out and another is asked, or is skipped
// while in backoff); before, the failure streak was per model: requests that drew
// the hung worker were degraded and three of them put the whole model in backoff.
func TestRemoteTokenizeHungWorker(t *testing.T) {
	var hungCalls, goodCalls atomic.Int64
	stop := make(chan struct{})
	hung := loopbackServer(t, func(w http.ResponseWriter, r *http.Request) {
		hungCalls.Add(1)
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	})
	t.Cleanup(func() { close(stop) }) // runs before the servers close
	good := loopbackServer(t, func(w http.ResponseWriter, r *http.Request) {
		goodCalls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"count":3,"max_model_len":4096,"tokens":[7,8,9]}`))
	})
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", TokenizePaths: []string{"remote"}, RemoteTokenizeTimeout: 100 * time.Millisecond}}
	cfg.Workers = []config.Worker{
		{Name: "a-hung", Address: hung.Listener.Addr().String()},
		{Name: "b-good", Address: good.Listener.Addr().String()},
	}
	a, err := New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 12 {
		req, _ := request.Parse(request.APIChat, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		res, _ := a.Tokenize.Tokenize(context.Background(), req)
		if res.Path != tokenize.PathRemote || len(res.Tokens) != 3 {
			t.Errorf("request %d: %+v, want the remote path (the healthy worker's ids)", i, res)
		}
	}
	if hungCalls.Load() == 0 || hungCalls.Load() > 3 {
		t.Errorf("hung worker asked %d times, want 1–3 (then skipped while in backoff)", hungCalls.Load())
	}
	if goodCalls.Load() != 12 {
		t.Errorf("healthy worker asked %d times, want 12", goodCalls.Load())
	}
	// /debug/tokenize names the hung worker and its backoff.
	rec := httptest.NewRecorder()
	a.AdminHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/tokenize", nil))
	var out struct {
		RemoteWorkers []tokenize.RemoteWorkerHealth `json:"remote_workers"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if len(out.RemoteWorkers) != 1 || out.RemoteWorkers[0].Address != hung.Listener.Addr().String() {
		t.Errorf("remote_workers = %+v, want only the hung worker", out.RemoteWorkers)
	}
}
