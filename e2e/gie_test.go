package e2e

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
)

// Conformance with the Gateway API Inference Extension endpoint picker protocol
// (gateway-api-inference-extension docs/proposals/004-endpoint-picker-protocol), one test
// per clause, through the Envoy stand-in configured as envoy/envoy-override-host.yaml
// (metadata_options.forwarding_namespaces [envoy.lb, envoy.lb.subset_hint], the
// override_host policy with retries, selected_host_key …-served). The gRPC health clause
// is app/ready_test.go.

const gieChat = `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}`

// "Endpoint Subset": a filter before ext_proc sets envoy.lb.subset_hint; Envoy forwards
// it in metadata_context; kvroute picks only from it.
func TestGIESubsetHint(t *testing.T) {
	hint := map[string]any{} // filled once the workers' addresses are known, before the stand-in starts
	f := newFixture(t, fixtureOpts{workers: 3,
		setup: func(ws []*testWorker) { hint["x-gateway-destination-endpoint-subset"] = []any{ws[1].addr()} },
		envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed, ForwardingNamespaces: []string{"envoy.lb.subset_hint"},
			RequestMetadata: map[string]map[string]any{"envoy.lb.subset_hint": hint}}})
	for i := 0; i < 6; i++ {
		if st, _, body := f.do("POST", "/v1/chat/completions", gieChat); st != 200 {
			t.Fatalf("status %d: %s", st, body)
		}
	}
	if f.workers[1].hits.Load() != 6 || f.workers[0].hits.Load()+f.workers[2].hits.Load() != 0 {
		t.Fatalf("hits %d/%d/%d: picks left the subset", f.workers[0].hits.Load(), f.workers[1].hits.Load(), f.workers[2].hits.Load())
	}
}

// "If none of the endpoints in the list is eligible or the list is empty, then the EPP
// MUST return an ImmediateResponse with 503."
func TestGIESubsetHintEmptyIs503(t *testing.T) {
	for _, subset := range []any{[]any{}, "192.0.2.1:8000"} {
		f := newFixture(t, fixtureOpts{envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed, ForwardingNamespaces: []string{"envoy.lb.subset_hint"},
			RequestMetadata: map[string]map[string]any{"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": subset}}}})
		if st, _, body := f.do("POST", "/v1/chat/completions", gieChat); st != 503 {
			t.Fatalf("subset %v: status %d %s, want 503", subset, st, body)
		}
		if f.workers[0].hits.Load()+f.workers[1].hits.Load() != 0 {
			t.Fatal("a request reached a worker outside an empty subset")
		}
	}
}

// "Destination Endpoint" (several endpoints, retries down the list) and "Destination
// Endpoint Served": with one worker down, override_host retries kvroute's next
// endpoint, reports the one that served, and kvroute moves the booking there. Round
// robin makes kvroute pick the dead worker for every other request.
func TestGIEFallbackListAndServedEndpoint(t *testing.T) {
	f := newFixture(t, fixtureOpts{
		setup: func(ws []*testWorker) { ws[0].srv.Close() }, // refuses connections from now on
		cfg: func(c *config.Config) {
			c.ExtProc.FallbackEndpoints = 1
			c.Scoring.Policy = "round_robin"
			c.Scoring.Scrape.Interval = 0 // no scraper: the dead worker stays eligible
		},
		envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed, OverrideHost: true, Retries: 1,
			MetadataKey: true, ForwardingNamespaces: []string{"envoy.lb"}}})
	for i := 0; i < 4; i++ {
		st, _, body := f.do("POST", "/v1/chat/completions", gieChat)
		if st != 200 || !strings.Contains(body, "[DONE]") {
			t.Fatalf("request %d: status %d %s (the retry down kvroute's list should have served it)", i, st, body)
		}
	}
	if f.workers[1].hits.Load() != 4 {
		t.Fatalf("the live worker served %d of 4", f.workers[1].hits.Load())
	}
	if got := testutil.ToFloat64(f.app.Metrics.Router.ServedMoves.WithLabelValues(f.workers[1].name)); got != 2 {
		t.Fatalf("served_moves_total = %v, want 2 (the picks of the dead worker)", got)
	}
	f.waitInFlight(0)
}
