package config

import (
	"regexp"
	"slices"
	"strings"
)

// ExtProc configures the Envoy ext_proc front (and the same headers in `kvroute proxy`).
type ExtProc struct {
	// DestinationHeader is the request header kvroute sets to the chosen "ip:port"; Envoy's
	// ORIGINAL_DST cluster (use_http_header) or override_host LB reads it. Must not start
	// with x-envoy- (Envoy's default mutation rules silently drop those).
	DestinationHeader string `mapstructure:"destination_header"`
	// MetadataNamespace receives the same value as dynamic metadata
	// (<namespace>/<destination_header>), the Gateway API Inference Extension protocol.
	// "" disables metadata.
	MetadataNamespace string `mapstructure:"metadata_namespace"`
	// MaxBodyBytes bounds an accumulated request body; larger bodies get 413.
	MaxBodyBytes int `mapstructure:"max_body_bytes"`
	// SLOHeader carries a per-request TTFT objective in milliseconds.
	SLOHeader string `mapstructure:"slo_header"`
	// PredictedTTFTHeader, when set, names a response header carrying the predicted TTFT
	// in milliseconds of the chosen worker. "" disables it.
	PredictedTTFTHeader string `mapstructure:"predicted_ttft_header"`
	// WorkerHeader, when set, names a response header carrying the chosen worker's name.
	WorkerHeader string `mapstructure:"worker_header"`
	// RequestBodyMode is the request body mode Envoy's filter is configured with
	// (NONE, STREAMED, BUFFERED, BUFFERED_PARTIAL, FULL_DUPLEX_STREAMED), used only
	// when Envoy does not announce it: Envoy sends protocol_config on the first message
	// of each stream, and that always wins.
	RequestBodyMode string `mapstructure:"request_body_mode"`
	// ResponseBodyMode is the same for the response direction.
	ResponseBodyMode string `mapstructure:"response_body_mode"`
	// ClearRouteCache sets clear_route_cache on the reply that carries the destination
	// header. Envoy's ORIGINAL_DST and override_host load balancers read the header at
	// host selection and do not need it; turn it on only when a route matches on a
	// header kvroute sets (envoy ext_proc PS DecodingProcessorState::clearRouteCache).
	ClearRouteCache bool `mapstructure:"clear_route_cache"`
	// MaxStreams bounds concurrent ext_proc streams across all connections (each open
	// stream may hold a booking); a stream over the limit fails at once with gRPC
	// RESOURCE_EXHAUSTED (Envoy then fails open or closed as configured). Also the
	// HTTP/2 MAX_CONCURRENT_STREAMS of each connection.
	MaxStreams int `mapstructure:"max_streams"`
	// MaxMessagesPerSecond bounds the ProcessingRequests one stream may send per second
	// (token bucket, burst of one second's worth); a stream over it fails with
	// RESOURCE_EXHAUSTED. 0 = unlimited. A streamed response is one message per body
	// chunk, so keep it far above a worker's tokens per second.
	MaxMessagesPerSecond float64 `mapstructure:"max_messages_per_second"`
	// SubsetHintNamespace is the request metadata namespace in which the gateway lists
	// the endpoints kvroute may pick from (key x-gateway-destination-endpoint-subset, a
	// list or a comma-separated string; the GIE endpoint picker protocol). Envoy forwards
	// it only when the filter lists it in metadata_options.forwarding_namespaces. ""
	// ignores subset hints.
	SubsetHintNamespace string `mapstructure:"subset_hint_namespace"`
	// FallbackEndpoints is how many next-best workers follow the pick in the destination
	// value ("ip:port,ip:port,..."), for a gateway that retries down the list (Envoy's
	// override_host load balancing policy). 0 sends the pick alone, which ORIGINAL_DST
	// requires: it does not split lists.
	FallbackEndpoints int `mapstructure:"fallback_endpoints"`
	// InjectIncludeUsage is proxy.inject_include_usage for the ext_proc front, within
	// what the processing modes permit: the request body must be replaceable (request
	// body mode BUFFERED or FULL_DUPLEX_STREAMED) and the response body too, to remove
	// the usage-only chunk (STREAMED, BUFFERED or FULL_DUPLEX_STREAMED); in any other
	// combination nothing is injected.
	InjectIncludeUsage bool `mapstructure:"inject_include_usage"`
}

// BodyModes are the accepted values of extproc.request_body_mode and
// extproc.response_body_mode (envoy.extensions.filters.http.ext_proc.v3.ProcessingMode.BodySendMode).
var BodyModes = []string{"NONE", "STREAMED", "BUFFERED", "BUFFERED_PARTIAL", "FULL_DUPLEX_STREAMED"}

func defaultExtProc() ExtProc {
	return ExtProc{DestinationHeader: "x-gateway-destination-endpoint", MetadataNamespace: "envoy.lb",
		MaxBodyBytes: 16 << 20, SLOHeader: "x-slo-ttft-ms", RequestBodyMode: "BUFFERED", ResponseBodyMode: "STREAMED",
		MaxStreams: 10000, MaxMessagesPerSecond: 5000, SubsetHintNamespace: "envoy.lb.subset_hint",
		InjectIncludeUsage: true}
}

// reservedHeaders are hop-by-hop and framing headers (RFC 9110 §7.6.1; Envoy strips or
// owns them, CMU) and routing pseudo-headers' plain twins: kvroute never sets them.
var reservedHeaders = map[string]bool{"connection": true, "keep-alive": true, "proxy-connection": true,
	"transfer-encoding": true, "te": true, "trailer": true, "upgrade": true, "content-length": true, "host": true}

var headerName = regexp.MustCompile(`^[a-z0-9!#$%&'*+.^_|~-]+$`)

func (e ExtProc) validate() error {
	for _, h := range []struct {
		key, v   string
		required bool
	}{
		{"extproc.destination_header", e.DestinationHeader, true},
		{"extproc.slo_header", e.SLOHeader, false},
		{"extproc.predicted_ttft_header", e.PredictedTTFTHeader, false},
		{"extproc.worker_header", e.WorkerHeader, false},
	} {
		if h.v == "" && !h.required {
			continue
		}
		if !headerName.MatchString(h.v) {
			return fieldErr(h.key, "%q is not a lower-case HTTP header name", h.v)
		}
	}
	for _, h := range []struct{ key, v string }{
		{"extproc.destination_header", e.DestinationHeader},
		{"extproc.predicted_ttft_header", e.PredictedTTFTHeader},
		{"extproc.worker_header", e.WorkerHeader},
	} {
		if reservedHeaders[h.v] {
			return fieldErr(h.key, "%q is a hop-by-hop or framing header kvroute must never set", h.v)
		}
	}
	if strings.HasPrefix(e.DestinationHeader, "x-envoy-") {
		return fieldErr("extproc.destination_header", "%q starts with x-envoy-: Envoy's default header mutation rules silently drop it; use e.g. x-gateway-destination-endpoint", e.DestinationHeader)
	}
	for _, m := range []struct{ key, v string }{{"extproc.request_body_mode", e.RequestBodyMode}, {"extproc.response_body_mode", e.ResponseBodyMode}} {
		if !slices.Contains(BodyModes, m.v) {
			return fieldErr(m.key, "%q is not one of %v", m.v, BodyModes)
		}
	}
	if e.FallbackEndpoints < 0 || e.FallbackEndpoints > 16 {
		return fieldErr("extproc.fallback_endpoints", "must be between 0 and 16, got %d", e.FallbackEndpoints)
	}
	if e.MaxBodyBytes < 1024 {
		return fieldErr("extproc.max_body_bytes", "must be ≥ 1024, got %d", e.MaxBodyBytes)
	}
	if e.MaxStreams < 1 {
		return fieldErr("extproc.max_streams", "must be ≥ 1, got %d", e.MaxStreams)
	}
	if e.MaxMessagesPerSecond < 0 {
		return fieldErr("extproc.max_messages_per_second", "must be ≥ 0 (0 = unlimited), got %g", e.MaxMessagesPerSecond)
	}
	return nil
}
