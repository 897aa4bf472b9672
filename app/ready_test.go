package app

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/testrun"
	"github.com/kvroute/kvroute/kvindex/kvevents"
)

// runHealthApp runs an App serving ext_proc (and gRPC health) on loopback and returns
// a health client.
func runHealthApp(t *testing.T, cfg *config.Config) (*App, healthpb.HealthClient) {
	t.Helper()
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln := testrun.Listen(t)
	testrun.Start(t, a, Listeners{ExtProc: ln})
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return a, healthpb.NewHealthClient(conn)
}

// waitStatus waits (generously: the status is recomputed every readinessInterval) until
// service reports want.
func waitStatus(t *testing.T, hc healthpb.HealthClient, service string, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var last healthpb.HealthCheckResponse_ServingStatus
	for time.Now().Before(deadline) {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
		if err == nil {
			if last = r.GetStatus(); last == want {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("health %q stayed %v, want %v", service, last, want)
}

// GIE endpoint picker protocol, "Health Checking": liveness, readiness and the ext_proc
// service name over the gRPC health protocol; readiness follows the workers' health.
func TestGRPCHealthLivenessAndReadiness(t *testing.T) {
	cfg := config.Default()
	cfg.Scoring.Scrape.Interval = 0
	cfg.Workers = []config.Worker{{Name: "w", Address: "127.0.0.1:9"}}
	a, hc := runHealthApp(t, &cfg)
	for _, svc := range []string{"liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor", ""} {
		waitStatus(t, hc, svc, healthpb.HealthCheckResponse_SERVING)
	}
	a.Registry.SetHealthy("w", false)
	for _, svc := range []string{"readiness", "envoy.service.ext_proc.v3.ExternalProcessor"} {
		waitStatus(t, hc, svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	waitStatus(t, hc, "liveness", healthpb.HealthCheckResponse_SERVING)
	rec := httptest.NewRecorder()
	a.readyz(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz %d with no healthy worker", rec.Code)
	}
	a.Registry.SetHealthy("w", true)
	waitStatus(t, hc, "readiness", healthpb.HealthCheckResponse_SERVING)
}

// With server.ready_requires_index, readiness waits until the KV index has been in sync
// for a worker once.
func TestReadinessWaitsForTheIndex(t *testing.T) {
	cfg := config.Default()
	cfg.Scoring.Scrape.Interval = 0
	cfg.Server.ReadyRequiresIndex = true
	cfg.Workers = []config.Worker{{Name: "w", Address: "127.0.0.1:9", KVEvents: config.WorkerKVEvents{Endpoint: "tcp://127.0.0.1:9"}}}
	a, hc := runHealthApp(t, &cfg)
	waitStatus(t, hc, "liveness", healthpb.HealthCheckResponse_SERVING)
	waitStatus(t, hc, "readiness", healthpb.HealthCheckResponse_NOT_SERVING)
	rec := httptest.NewRecorder()
	a.readyz(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz %d before the index synced", rec.Code)
	}
	if err := a.Index.ApplyBatch("w", 0, &kvevents.Batch{}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, hc, "readiness", healthpb.HealthCheckResponse_SERVING)
	rec = httptest.NewRecorder()
	a.readyz(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/readyz %d after the index synced", rec.Code)
	}
}
