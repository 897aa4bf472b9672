package app

import (
	"context"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/kvindex"
)

// gRPC health service names (grpc/doc/health-checking.md). The Gateway API Inference
// Extension endpoint picker protocol (docs/proposals/004-endpoint-picker-protocol,
// "Health Checking") names liveness, readiness and the ext_proc service; "" is the
// server as a whole (what Envoy's grpc_health_check asks by default).
const (
	healthLiveness  = "liveness"
	healthReadiness = "readiness"
)

// readiness says whether kvroute should receive requests, and why not: its servers
// run, at least one worker is healthy, and — with server.ready_requires_index — the KV
// index has been in sync (exact mode) for at least one worker once. GET /readyz and the
// gRPC readiness services answer from it.
func (a *App) readiness() (bool, string) {
	select {
	case <-a.ready:
	default:
		return false, "starting"
	}
	healthy := false
	for _, wk := range a.Registry.All() {
		if a.Registry.Healthy(wk.Name) {
			healthy = true
			break
		}
	}
	if !healthy {
		return false, "no healthy worker"
	}
	if a.Config.Server.ReadyRequiresIndex && !a.indexSynced.Load() {
		for _, wk := range a.Registry.All() {
			if a.Index.Mode(wk.Name) == kvindex.ModeExact {
				a.indexSynced.Store(true)
				break
			}
		}
		if !a.indexSynced.Load() {
			return false, "KV index not yet in sync for any worker"
		}
	}
	return true, ""
}

// readinessInterval is how often the gRPC readiness status is recomputed.
const readinessInterval = time.Second

// updateHealth sets hs's statuses: liveness SERVING while the process runs;
// readiness, the ext_proc service and "" follow readiness().
func (a *App) updateHealth(hs *health.Server) {
	hs.SetServingStatus(healthLiveness, healthpb.HealthCheckResponse_SERVING)
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok, _ := a.readiness(); ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, svc := range []string{"", healthReadiness, extprocv3.ExternalProcessor_ServiceDesc.ServiceName} {
		hs.SetServingStatus(svc, st)
	}
}

// serveHealth keeps hs's statuses current (updateHealth every readinessInterval)
// until ctx ends.
func (a *App) serveHealth(ctx context.Context, hs *health.Server) {
	t := time.NewTicker(readinessInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.updateHealth(hs)
		}
	}
}
