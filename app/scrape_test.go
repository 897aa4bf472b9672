package app

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/testrun"
)

// App.Run starts the vLLM /metrics scraper: a worker's scraped load appears in the
// registry, and Run returns once the context is cancelled.
func TestRunScrapesWorkers(t *testing.T) {
	scraped := make(chan struct{}, 1)
	vllm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("vllm:num_requests_waiting{engine=\"0\"} 4\nvllm:num_requests_running{engine=\"0\"} 2\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.5\n"))
		select {
		case scraped <- struct{}{}:
		default:
		}
	}))
	defer vllm.Close()
	cfg := config.Default()
	cfg.Scoring.Scrape.Interval = 20 * time.Millisecond
	cfg.Workers = []config.Worker{{Name: "w", Address: strings.TrimPrefix(vllm.URL, "http://")}}
	a, err := New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop := testrun.Start(t, a, Listeners{Admin: testrun.Listen(t)})
	deadline := time.After(30 * time.Second)
	for a.Registry.Load("w").ScrapedAt.IsZero() {
		select {
		case <-scraped:
		case <-deadline:
			t.Fatal("no scrape recorded within 30 s")
		}
	}
	if l := a.Registry.Load("w"); l.Waiting != 4 || l.Running != 2 || l.KVUsage != 0.5 {
		t.Fatalf("scraped load %+v", l)
	}
	stop()
}
