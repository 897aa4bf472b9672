package app

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/testrun"
	"github.com/kvroute/kvroute/workers"
)

type changes chan struct{}

func (c changes) WorkerAdded(*workers.Worker)   { c <- struct{}{} }
func (c changes) WorkerRemoved(*workers.Worker) { c <- struct{}{} }

// discovery.mode=dns wires a DNS source into Run: "localhost" resolves from /etc/hosts,
// so no network is needed.
func TestRunStartsDNSDiscovery(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m"}}
	cfg.Workers = []config.Worker{{Name: "static", Address: "10.0.0.9:8000"}}
	cfg.Discovery.Mode, cfg.Discovery.DNS.Name, cfg.Discovery.DNS.HTTPPort = "dns", "localhost", 18000
	cfg.Discovery.KVEventsEndpoint = "tcp://{ip}:{port}"
	a, stop := startDiscovery(t, &cfg, func(a *App) bool { _, ok := a.Registry.Get("127.0.0.1:18000"); return ok })
	defer stop()
	w, _ := a.Registry.Get("127.0.0.1:18000")
	if w.KVEvents.Endpoint != "tcp://127.0.0.1:5557" || len(w.Models) != 1 || w.Models[0] != "m" {
		t.Fatalf("discovered worker built from the discovery keys: %+v", w)
	}
	if _, ok := a.Registry.Get("static"); !ok {
		t.Fatal("static workers stay beside discovered ones")
	}
}

func TestRunFailsWhenKubernetesIsUnreachable(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	cfg := config.Default()
	cfg.Discovery.Mode, cfg.Discovery.Kubernetes.Service = "kubernetes", "vllm"
	a, err := New(&cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Run(t.Context(), Listeners{}); err == nil {
		t.Fatal("outside a cluster, kubernetes discovery must fail the start, not route to nothing silently")
	}
}

func TestStaticWorkersAreCounted(t *testing.T) {
	cfg := config.Default()
	cfg.Workers = []config.Worker{{Address: "10.0.0.1:8000"}, {Address: "10.0.0.2:8000"}}
	a, err := New(&cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := a.Run(ctx, Listeners{}); err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(a.Metrics.Workers.Discovered.WithLabelValues("static", "ready")); n != 2 {
		t.Fatalf("kvroute_discovery_workers{source=static,state=ready} = %v, want 2", n)
	}
}

// workers[].profile.max_num_seqs reaches the registered worker, whose engine limit
// the router's saturation gate reads (router.Saturation.SaturatedOn).
func TestWorkerProfileMaxNumSeqsRegistered(t *testing.T) {
	cfg := config.Default()
	cfg.Workers = []config.Worker{{Address: "10.0.0.1:8000", Profile: config.WorkerProfile{MaxNumSeqs: 1024}}, {Address: "10.0.0.2:8000"}}
	ws := staticWorkers(&cfg)
	if len(ws) != 2 || ws[0].Profile.MaxNumSeqs != 1024 || ws[1].Profile.MaxNumSeqs != 0 {
		t.Fatalf("profiles %+v / %+v, want max_num_seqs 1024 and 0 (router default 256)", ws[0].Profile, ws[1].Profile)
	}
}

// discovery.role and discovery.sources: a decode source and a prefill source (both
// "localhost" on two ports, as a decode and a prefill headless Service would be)
// register their workers with their roles, beside the static ones.
func TestRunDiscoversRolesPerSource(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m"}}
	cfg.Workers = []config.Worker{{Name: "static", Address: "10.0.0.9:8000", Role: "decode"}}
	cfg.Discovery.Mode, cfg.Discovery.Role, cfg.Discovery.DNS.Name, cfg.Discovery.DNS.HTTPPort = "dns", "decode", "localhost", 18000
	cfg.Discovery.Sources = []config.DiscoverySource{{Mode: "dns", Role: "prefill", DNS: config.DNSDiscovery{Name: "localhost", HTTPPort: 18001}}}
	a, stop := startDiscovery(t, &cfg, func(a *App) bool {
		_, okD := a.Registry.Get("127.0.0.1:18000")
		_, okP := a.Registry.Get("127.0.0.1:18001")
		return okD && okP
	})
	defer stop()
	d, _ := a.Registry.Get("127.0.0.1:18000")
	p, _ := a.Registry.Get("127.0.0.1:18001")
	if d.Role != workers.RoleDecode || p.Role != workers.RolePrefill {
		t.Fatalf("roles %q / %q, want decode from discovery.role and prefill from its source", d.Role, p.Role)
	}
	if _, ok := a.Registry.Get("static"); !ok {
		t.Fatal("static workers stay beside discovered ones")
	}
}

// startDiscovery validates cfg, starts its app and returns it with a stop function,
// once until(a) holds, re-checked on every registry change (it fails after a generous
// deadline, never reached when correct).
func startDiscovery(t *testing.T, cfg *config.Config, until func(a *App) bool) (*App, func()) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	a, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ch := make(changes, 100)
	a.Registry.Subscribe(ch)
	stop := testrun.Start(t, a, Listeners{})
	deadline := time.After(10 * time.Second)
	for !until(a) {
		select {
		case <-ch:
		case <-deadline:
			stop()
			t.Fatalf("discovery never reached the wanted registry; it is %v", a.Registry.All())
		}
	}
	return a, stop
}
