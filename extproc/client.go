package extproc

import (
	"net/netip"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// attributesKey is the key of ProcessingRequest.attributes under which Envoy's ext_proc
// filter sends the attributes listed in its request_attributes (envoy
// api/envoy/service/ext_proc/v3/external_processor.proto: keyed by filter name).
const attributesKey = "envoy.filters.http.ext_proc"

// clientAddr is the downstream client's address from the source.address attribute
// (Envoy attribute "source.address", "ip:port"; sent when the ext_proc filter lists it
// in request_attributes), the zero Addr when absent or not an address. It keys the
// failed-API-key throttle (admission.auth_throttle): Envoy's word, never a header a
// client could set.
func clientAddr(req *extprocv3.ProcessingRequest) netip.Addr {
	s := req.GetAttributes()[attributesKey].GetFields()["source.address"].GetStringValue()
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr()
	}
	a, _ := netip.ParseAddr(s)
	return a
}
