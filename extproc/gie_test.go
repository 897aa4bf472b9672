package extproc

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/router"
)

// The Gateway API Inference Extension endpoint picker protocol
// (gateway-api-inference-extension docs/proposals/004-endpoint-picker-protocol) on the
// ext_proc messages. Envoy puts the namespaces listed in
// metadata_options.forwarding_namespaces into every ProcessingRequest's
// metadata_context (SVC; CC addDynamicMetadata); these tests send exactly that.

func withMeta(r *extprocv3.ProcessingRequest, ns, key string, v *structpb.Value) *extprocv3.ProcessingRequest {
	r.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{ns: {Fields: map[string]*structpb.Value{key: v}}}}
	return r
}

func strList(s ...string) *structpb.Value {
	vs := make([]*structpb.Value, len(s))
	for i, e := range s {
		vs[i] = structpb.NewStringValue(e)
	}
	return structpb.NewListValue(&structpb.ListValue{Values: vs})
}

// pickBuffered runs a BUFFERED request whose headers carry md (nil: none) and returns
// the reply that releases the headers (the body reply).
func pickBuffered(t *testing.T, h *harness, md *structpb.Value) *extprocv3.ProcessingResponse {
	t.Helper()
	s := h.open(t)
	first := hdrs(false, post("/v1/chat/completions")...)
	if md != nil {
		first = withMeta(first, "envoy.lb.subset_hint", "x-gateway-destination-endpoint-subset", md)
	}
	s.send(withPC(first, modeBuffered, modeStreamed))
	s.recv()
	s.send(body(chatBody, true))
	return s.recv()
}

// "Endpoint Subset": the list form and the comma-separated form both restrict the pick.
func TestSubsetHintRestrictsThePick(t *testing.T) {
	for name, v := range map[string]*structpb.Value{
		"list":   strList("10.0.0.2:8000"),
		"string": structpb.NewStringValue(" 10.0.0.2:8000 , 192.0.2.7:9000"),
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			for i := 0; i < 6; i++ {
				r := pickBuffered(t, h, v)
				if got := destOf(t, r.GetRequestBody().GetResponse().GetHeaderMutation(), "x-gateway-destination-endpoint"); got != "10.0.0.2:8000" {
					t.Fatalf("pick %d went to %q outside the subset", i, got)
				}
			}
		})
	}
}

// "If none of the endpoints in the list is eligible or the list is empty, then the EPP
// MUST return an ImmediateResponse with 503."
func TestSubsetHintEmptyGives503(t *testing.T) {
	for name, v := range map[string]*structpb.Value{
		"empty list":   strList(),
		"empty string": structpb.NewStringValue(""),
		"ineligible":   strList("192.0.2.7:9000"),
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			r := pickBuffered(t, h, v)
			if c := r.GetImmediateResponse().GetStatus().GetCode(); c != 503 {
				t.Fatalf("got %v, want an ImmediateResponse 503", r)
			}
		})
	}
}

// Without the key, and with subset hints turned off, every worker stays eligible.
func TestSubsetHintAbsentOrDisabled(t *testing.T) {
	h := newHarness(t, func(c *config.ExtProc, _ *router.Options) { c.SubsetHintNamespace = "" })
	seen := map[string]bool{}
	for i := 0; i < 8; i++ {
		r := pickBuffered(t, h, strList("10.0.0.2:8000"))
		seen[destOf(t, r.GetRequestBody().GetResponse().GetHeaderMutation(), "x-gateway-destination-endpoint")] = true
	}
	if !seen["10.0.0.1:8000"] || !seen["10.0.0.2:8000"] {
		t.Fatalf("with subset hints disabled the picks covered only %v", seen)
	}
}

// "Destination Endpoint": with extproc.fallback_endpoints the header and the metadata
// carry the same ordered list, the pick first; by default a single endpoint (what
// ORIGINAL_DST requires).
func TestFallbackEndpointsList(t *testing.T) {
	h := newHarness(t, func(c *config.ExtProc, _ *router.Options) { c.FallbackEndpoints = 3 })
	r := pickBuffered(t, h, nil)
	hdr := destOf(t, r.GetRequestBody().GetResponse().GetHeaderMutation(), "x-gateway-destination-endpoint")
	if hdr != "10.0.0.1:8000,10.0.0.2:8000" && hdr != "10.0.0.2:8000,10.0.0.1:8000" {
		t.Fatalf("destination %q, want the pick then the other worker", hdr)
	}
	if md := metaDest(r); md != hdr {
		t.Fatalf("metadata %q differs from the header %q (the protocol forbids it)", md, hdr)
	}
	h = newHarness(t)
	r = pickBuffered(t, h, nil)
	if got := destOf(t, r.GetRequestBody().GetResponse().GetHeaderMutation(), "x-gateway-destination-endpoint"); got != "10.0.0.1:8000" && got != "10.0.0.2:8000" {
		t.Fatalf("default destination %q is not a single endpoint", got)
	}
}

// "Destination Endpoint Served": the response path reports the endpoint that served;
// kvroute moves the booking there and counts it.
func TestServedEndpointMovesTheBooking(t *testing.T) {
	h := newHarness(t)
	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeBuffered, modeStreamed))
	s.recv()
	s.send(body(chatBody, true))
	r := s.recv()
	picked := destOf(t, r.GetRequestBody().GetResponse().GetHeaderMutation(), "x-gateway-destination-endpoint")
	served, servedName := "10.0.0.2:8000", "w2"
	if picked == served {
		served, servedName = "10.0.0.1:8000", "w1"
	}
	s.send(withMeta(rspHdrs(false, ":status", "200", "content-type", "text/event-stream"), "envoy.lb", "x-gateway-destination-endpoint-served", structpb.NewStringValue(served)))
	s.recv()
	ws, _ := h.router.Snapshot()
	for _, w := range ws {
		want := 0
		if w.Name == servedName {
			want = 1
		}
		if w.Booked.Requests != want {
			t.Fatalf("worker %s booked %d, want %d after the served report", w.Name, w.Booked.Requests, want)
		}
	}
	if got := testutil.ToFloat64(h.ms.Router.ServedMoves.WithLabelValues(servedName)); got != 1 {
		t.Fatalf("served_moves_total{worker=%s} = %v, want 1", servedName, got)
	}
	s.send(rspBody(sse, true))
	s.recv()
	if n := h.router.InFlight(); n != 0 {
		t.Fatalf("%d in flight after the response ended", n)
	}
}
