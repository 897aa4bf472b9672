package extproc

import (
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// The Gateway API Inference Extension endpoint picker protocol's inputs
// (gateway-api-inference-extension docs/proposals/004-endpoint-picker-protocol): Envoy
// forwards them in ProcessingRequest.metadata_context for the namespaces listed in the
// filter's metadata_options.forwarding_namespaces (SVC metadata_context; CC
// addDynamicMetadata, on every message).

// subsetKey is the protocol's key for the endpoint subset, under
// extproc.subset_hint_namespace (default envoy.lb.subset_hint).
const subsetKey = "x-gateway-destination-endpoint-subset"

// maxSubset bounds the endpoints read from one subset hint; a longer list is cut (the
// gateway's pool is never that large, and the list is matched per candidate).
const maxSubset = 4096

// readSubsetHint reads the endpoint subset the gateway allows for this request ("Endpoint
// Subset": the EPP MUST only select endpoints from the list; an empty list is a 503).
// Absent namespace or key: no restriction.
func (st *stream) readSubsetHint(md *corev3.Metadata) {
	ns := st.s.opt.Config.SubsetHintNamespace
	if ns == "" || md == nil {
		return
	}
	v, ok := md.GetFilterMetadata()[ns].GetFields()[subsetKey]
	if !ok {
		return
	}
	st.subset, st.hasSubset = endpointList(v), true
}

// readServed moves the booking when the gateway reports that another endpoint served
// the request ("Destination Endpoint Served": <metadata_namespace>/<destination
// header>-served on the response path), e.g. after a retry down the fallback list. It
// is read once, from the first response message that carries it.
func (st *stream) readServed(md *corev3.Metadata) {
	cfg := &st.s.opt.Config
	if st.servedSeen || st.ticket == nil || md == nil || cfg.MetadataNamespace == "" {
		return
	}
	v, ok := md.GetFilterMetadata()[cfg.MetadataNamespace].GetFields()[cfg.DestinationHeader+"-served"]
	if !ok {
		return
	}
	st.servedSeen = true
	if eps := endpointList(v); len(eps) > 0 {
		st.ticket.Served(eps[0])
	}
}

// endpointList reads "ip:port" endpoints from a metadata value: a list of strings, or
// one string of comma-separated endpoints (the protocol's text form); blanks are
// skipped, at most maxSubset kept. Never nil, so an empty hint stays an empty subset.
func endpointList(v *structpb.Value) []string {
	out := []string{}
	add := func(s string) {
		for _, e := range strings.Split(s, ",") {
			if e = strings.TrimSpace(e); e != "" && len(out) < maxSubset {
				out = append(out, e)
			}
		}
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		add(k.StringValue)
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			if s, ok := e.GetKind().(*structpb.Value_StringValue); ok {
				add(s.StringValue)
			}
		}
	}
	return out
}
