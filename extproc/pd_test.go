package extproc

import (
	"slices"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvroute/kvroute/workers"
)

// Prefill/decode disaggregation through ext_proc follows llm-d's convention: the
// destination (header and envoy.lb metadata) is the decode worker and the prefill
// worker rides in x-prefiller-host-port, set with append=false so that a client's copy
// is replaced (Envoy set_headers overwrite); without a remote prefill the header is
// removed, so a client never chooses a prefill worker. (Envoy forwards both to the
// decode worker's sidecar, which runs the prefill leg; no sidecar runs here.)
func TestPrefillWorkerInXPrefillerHostPort(t *testing.T) {
	h := newHarness(t)
	h.reg.Set([]*workers.Worker{
		{Name: "d", Address: "10.0.0.1:8000", Models: []string{"m"}, Role: workers.RoleDecode},
		{Name: "p", Address: "10.0.0.3:8000", Models: []string{"m"}, Role: workers.RolePrefill},
	})
	r := pickWithClientPrefiller(t, h)
	mut := r.GetRequestBody().GetResponse().GetHeaderMutation()
	if got := destOf(t, mut, "x-gateway-destination-endpoint"); got != "10.0.0.1:8000" {
		t.Fatalf("destination %q, want the decode worker", got)
	}
	if got := destOf(t, mut, PrefillHeader); got != "10.0.0.3:8000" {
		t.Fatalf("%s %q, want the prefill worker", PrefillHeader, got)
	}
	if slices.Contains(mut.GetRemoveHeaders(), PrefillHeader) {
		t.Fatal("the header kvroute sets must not also be removed")
	}
	lb := r.GetDynamicMetadata().GetFields()["envoy.lb"].GetStructValue().GetFields()
	if lb["x-gateway-destination-endpoint"].GetStringValue() != "10.0.0.1:8000" || lb[PrefillHeader].GetStringValue() != "10.0.0.3:8000" {
		t.Fatalf("envoy.lb metadata %v: want the decode destination and the prefill worker", lb)
	}

	// An aggregated pool: no prefill worker, and the client's header is removed.
	h.reg.Set([]*workers.Worker{{Name: "w1", Address: "10.0.0.1:8000", Models: []string{"m"}}})
	r = pickWithClientPrefiller(t, h)
	mut = r.GetRequestBody().GetResponse().GetHeaderMutation()
	if destOf(t, mut, PrefillHeader) != "" || !slices.Contains(mut.GetRemoveHeaders(), PrefillHeader) {
		t.Fatalf("aggregated pick: set %v remove %v; want %s removed, not set", mut.GetSetHeaders(), mut.GetRemoveHeaders(), PrefillHeader)
	}
	if _, ok := r.GetDynamicMetadata().GetFields()["envoy.lb"].GetStructValue().GetFields()[PrefillHeader]; ok {
		t.Fatal("aggregated pick: no prefill worker in the metadata")
	}
}

// pickWithClientPrefiller runs a BUFFERED request whose client sent its own
// x-prefiller-host-port, and returns the reply that releases the headers.
func pickWithClientPrefiller(t *testing.T, h *harness) *extprocv3.ProcessingResponse {
	t.Helper()
	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions", PrefillHeader, "203.0.113.9:1")...), modeBuffered, modeStreamed))
	s.recv()
	s.send(body(chatBody, true))
	return s.recv()
}
