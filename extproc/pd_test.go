package extproc

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

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

// A client's kv_transfer_params never reach the worker (only kvroute's pair pick, by
// x-prefiller-host-port, steers a KV transfer): in BUFFERED mode the body reply
// replaces the body (body_mutation.body, content-length set to the new length, as
// Envoy's validateContentLength requires); in FULL_DUPLEX_STREAMED the streamed_response
// bytes Envoy forwards lack them; in BUFFERED_PARTIAL, where the body passes on as
// Envoy holds it, the request is refused with a 400.
func TestClientKVTransferParamsStripped(t *testing.T) {
	const withKV = `{"model":"m","kv_transfer_params":{"do_remote_prefill":true,"remote_host":"203.0.113.9","remote_port":1},"messages":[{"role":"user","content":"hello"}]}`
	const want = `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
	h := newHarness(t)

	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions", "content-length", strconv.Itoa(len(withKV)))...), modeBuffered, modeStreamed))
	s.recv()
	s.send(body(withKV, true))
	cr := s.recv().GetRequestBody().GetResponse()
	if got := string(cr.GetBodyMutation().GetBody()); got != want {
		t.Fatalf("BUFFERED body mutation %q, want %q", got, want)
	}
	if got := destOf(t, cr.GetHeaderMutation(), "content-length"); got != strconv.Itoa(len(want)) {
		t.Fatalf("content-length %q, want %d", got, len(want))
	}
	if destOf(t, cr.GetHeaderMutation(), "x-gateway-destination-endpoint") == "" {
		t.Fatal("the stripped request lost its destination")
	}

	s = h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeFullDuplex, modeStreamed), body(withKV, true))
	s.recv() // the headers reply with the decision
	if sr := s.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse(); sr == nil || string(sr.GetBody()) != want || !sr.GetEndOfStream() {
		t.Fatalf("FULL_DUPLEX streamed_response %q, want %q", sr.GetBody(), want)
	}
	if got := testutil.ToFloat64(h.ms.ExtProc.ClientKVParams.WithLabelValues("extproc", "stripped")); got != 2 {
		t.Fatalf("client_kv_transfer_params_total{stripped} = %v, want 2", got)
	}

	s = h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeBufferedPartial, modeStreamed))
	s.recv()
	s.send(body(withKV, true))
	ir := s.recv().GetImmediateResponse()
	if ir == nil || ir.GetStatus().GetCode() != 400 || !strings.Contains(string(ir.GetBody()), "kv_transfer_params") {
		t.Fatalf("BUFFERED_PARTIAL: %v, want a 400 naming kv_transfer_params", ir)
	}
	if got := testutil.ToFloat64(h.ms.ExtProc.ClientKVParams.WithLabelValues("extproc", "refused")); got != 1 {
		t.Fatalf("client_kv_transfer_params_total{refused} = %v, want 1", got)
	}
	if h.router.InFlight() != 2 {
		t.Fatalf("in flight %d, want the two admitted requests only", h.router.InFlight())
	}

	// The key inside a string is no member: the body passes unchanged.
	s = h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeBuffered, modeStreamed))
	s.recv()
	s.send(body(`{"model":"m","messages":[{"role":"user","content":"\"kv_transfer_params\""}]}`, true))
	if bm := s.recv().GetRequestBody().GetResponse().GetBodyMutation(); bm != nil {
		t.Fatalf("a body without the member was mutated: %v", bm)
	}
}
