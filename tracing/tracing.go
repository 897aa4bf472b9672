// Package tracing exports OpenTelemetry traces of kvroute's routing decisions over OTLP
// and carries W3C trace context (https://www.w3.org/TR/trace-context/) between the
// caller, kvroute and the chosen worker.
//
// One span per request, "kvroute.route", started by the front (ext_proc stream or
// proxy handler) as a child of the caller's traceparent; the router adds children
// ("kvroute.parse", "kvroute.tokenize", "kvroute.index_lookup", "kvroute.pick") and the
// front adds events "first_token" and "completion" and ends it with the response.
// Attributes follow the OpenTelemetry GenAI semantic conventions where they exist
// (gen_ai.request.model, gen_ai.usage.input_tokens, …) and the kvroute.* namespace
// for the rest. The route span's context is injected into the upstream request, so a
// vLLM started with --otlp-traces-endpoint joins the same trace.
//
// Each App owns its Provider (no global OpenTelemetry state): tests and several Apps
// in one process never share spans.
package tracing

import (
	"context"
	"fmt"
	"os"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Options configure a Provider (config.Tracing).
type Options struct {
	Enabled     bool
	Protocol    string  // "grpc" or "http/protobuf"
	Endpoint    string  // host:port; "" → OTEL_EXPORTER_OTLP_ENDPOINT or the exporter default
	Insecure    bool    // no TLS
	SampleRatio float64 // 0..1 of new traces; parents' decisions are followed
	Version     string  // service.version
}

// Provider hands out kvroute's tracer and flushes spans on Shutdown.
type Provider struct {
	tracer trace.Tracer
	sdk    *sdktrace.TracerProvider // nil when disabled
}

// Propagator is W3C trace context (traceparent, tracestate), what vLLM and Envoy read.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// New builds the provider. Disabled, its tracer records nothing (and costs nothing)
// while context still propagates. Errors come from the exporter's configuration.
func New(ctx context.Context, o Options) (*Provider, error) {
	if !o.Enabled {
		return &Provider{tracer: noop.NewTracerProvider().Tracer(instrumentation)}, nil
	}
	var client otlptrace.Client
	switch o.Protocol {
	case "", "grpc":
		var opts []otlptracegrpc.Option
		if o.Endpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpoint(o.Endpoint))
		}
		if o.Insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		client = otlptracegrpc.NewClient(opts...)
	case "http/protobuf":
		var opts []otlptracehttp.Option
		if o.Endpoint != "" {
			opts = append(opts, otlptracehttp.WithEndpoint(o.Endpoint))
		}
		if o.Insecure {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		client = otlptracehttp.NewClient(opts...)
	default:
		return nil, fmt.Errorf("tracing: unknown OTLP protocol %q", o.Protocol)
	}
	exp, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName("kvroute"), semconv.ServiceVersion(o.Version)))
	if err != nil {
		return nil, err
	}
	if env, err := resource.New(ctx, resource.WithFromEnv()); err == nil { // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
		if merged, err := resource.Merge(res, env); err == nil {
			res = merged
		}
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp), sdktrace.WithResource(res)}
	if os.Getenv("OTEL_TRACES_SAMPLER") == "" { // else the SDK reads it
		opts = append(opts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SampleRatio))))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	return &Provider{tracer: tp.Tracer(instrumentation), sdk: tp}, nil
}

// instrumentation is the tracer's instrumentation scope name.
const instrumentation = "github.com/kvroute/kvroute"

// Tracer returns the tracer spans are started from.
func (p *Provider) Tracer() trace.Tracer { return p.tracer }

// Shutdown flushes pending spans and stops the exporter (ctx bounds the wait).
func (p *Provider) Shutdown(ctx context.Context) error {
	if p.sdk == nil {
		return nil
	}
	return p.sdk.Shutdown(ctx)
}

// Noop is a tracer that records nothing: the default where none is configured.
var Noop trace.Tracer = noop.NewTracerProvider().Tracer(instrumentation)
