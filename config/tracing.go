package config

import "slices"

// Tracing configures OpenTelemetry traces of routing decisions (package tracing). The
// OTLP exporter also reads the standard OTEL_EXPORTER_OTLP_* variables (endpoint,
// headers, TLS, timeout), and the resource OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES; a key set here wins over them.
type Tracing struct {
	// Enabled turns span export on. Off, kvroute still continues the caller's W3C
	// traceparent into the upstream request, at no cost.
	Enabled bool `mapstructure:"enabled"`
	// Protocol is the OTLP transport: "grpc" (port 4317) or "http/protobuf" (4318).
	Protocol string `mapstructure:"protocol"`
	// Endpoint is the collector's host:port ("" → OTEL_EXPORTER_OTLP_ENDPOINT, else
	// the exporter's localhost default).
	Endpoint string `mapstructure:"endpoint"`
	// Insecure sends without TLS (a collector on the same host or pod network).
	Insecure bool `mapstructure:"insecure"`
	// SampleRatio is the fraction of new traces sampled, 0..1; a caller's sampled
	// flag is always followed (parent-based). OTEL_TRACES_SAMPLER, when set, wins.
	SampleRatio float64 `mapstructure:"sample_ratio"`
}

// TracingProtocols are the accepted values of tracing.protocol.
var TracingProtocols = []string{"grpc", "http/protobuf"}

func defaultTracing() Tracing {
	return Tracing{Protocol: "grpc", Insecure: true, SampleRatio: 1}
}

func (t Tracing) validate() error {
	if !slices.Contains(TracingProtocols, t.Protocol) {
		return fieldErr("tracing.protocol", "%q is not one of %v", t.Protocol, TracingProtocols)
	}
	if t.SampleRatio < 0 || t.SampleRatio > 1 {
		return fieldErr("tracing.sample_ratio", "must be in 0..1, got %g", t.SampleRatio)
	}
	return nil
}
