package e2e

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/sim"
)

// simWorkers starts n simulated vLLM engines serving model m and adapters in maxLoRAs
// slots (vllm-sim --lora-modules --max-loras), 1 ms steps, and configures them and the
// adapters (models with base m) in cfg.
func simWorkers(t *testing.T, cfg *config.Config, n int, adapters []string, maxLoRAs int) []*sim.Worker {
	t.Helper()
	prof, err := sim.LookupProfile("h100-8b")
	if err != nil {
		t.Fatal(err)
	}
	prof.Model, prof.MaxLoRAs, prof.LoRALoadTime = "m", maxLoRAs, 5*time.Millisecond
	models := append([]string{"m"}, adapters...)
	for _, a := range adapters {
		cfg.Models = append(cfg.Models, config.Model{Name: a, Base: "m"})
	}
	var out []*sim.Worker
	for i := 0; i < n; i++ {
		w, err := sim.NewWorker(sim.WorkerOptions{Profile: prof, Model: "m", Seed: uint64(i + 1), LoRAModules: adapters})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { w.Runner.Run(ctx); close(done) }()
		srv := httptest.NewServer(w)
		t.Cleanup(func() { srv.Close(); cancel(); <-done })
		cfg.Workers = append(cfg.Workers, config.Worker{Name: "s" + string(rune('1'+i)), Address: strings.TrimPrefix(srv.URL, "http://"), Models: models})
		out = append(out, w)
	}
	return out
}

// LoRA through both fronts on vllm-sim: with one slot per worker, two adapters go to
// different workers (a free slot beats evicting the other's adapter), and each
// adapter's later requests return to its worker: two loads in all, where routing
// blind to adapters reloads (round robin: 5 loads).
func TestLoRAAdapterAffinityThroughBothFronts(t *testing.T) {
	for _, front := range []struct {
		name string
		o    fixtureOpts
	}{
		{"ext_proc (Envoy stand-in)", fixtureOpts{envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed}}},
		{"kvroute proxy", fixtureOpts{proxy: true}},
	} {
		t.Run(front.name, func(t *testing.T) {
			o := front.o
			o.simAdapters, o.simMaxLoRAs = []string{"sql", "chat"}, 1
			o.cfg = func(c *config.Config) { c.Scoring.Scrape.Interval = 20 * time.Millisecond }
			f := newFixture(t, o)
			// the scraper has read every worker's vllm:lora_requests_info once
			deadline := time.Now().Add(30 * time.Second)
			for _, w := range f.app.Registry.All() {
				for !f.app.Registry.Load(w.Name).Adapters.Known() {
					if time.Now().After(deadline) {
						t.Fatalf("%s: no LoRA state scraped", w.Name)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			for i, model := range []string{"sql", "sql", "chat", "chat", "sql", "chat", "m"} {
				st, _, body := f.do("POST", "/v1/completions", `{"model":"`+model+`","prompt":"t5 t6 t7 t8","max_tokens":2}`)
				if st != 200 || !strings.Contains(body, `"model":"`+model+`"`) {
					t.Fatalf("request %d (%s): %d %s", i, model, st, body)
				}
				f.waitInFlight(0)
			}
			var loads uint64
			for _, w := range f.sims {
				loads += w.Runner.Stats().LoRALoads
				if slots := w.Runner.Stats(); len(slots.RunningLoRAs) != 0 {
					t.Fatalf("adapters still running: %v", slots.RunningLoRAs)
				}
			}
			if loads != 2 {
				t.Fatalf("%d adapter loads over the workers, want 2 (each adapter once, on its own worker)", loads)
			}
			ps := f.app.Metrics.Scoring.AdapterPicks
			if fs, ld := testutil.ToFloat64(ps.WithLabelValues("free_slot")), testutil.ToFloat64(ps.WithLabelValues("loaded")); fs != 2 || ld != 4 {
				t.Fatalf("adapter_picks_total: free_slot %v loaded %v, want 2 and 4", fs, ld)
			}
			if st, _, body := f.do("POST", "/v1/completions", `{"model":"nope","prompt":"t5","max_tokens":1}`); st != 404 {
				t.Fatalf("unknown adapter: %d %s, want 404", st, body)
			}
		})
	}
}
