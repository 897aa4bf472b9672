package tracing

import (
	"context"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute/response"
)

// Span names.
const (
	SpanRoute       = "kvroute.route"
	SpanParse       = "kvroute.parse"
	SpanTokenize    = "kvroute.tokenize"
	SpanIndexLookup = "kvroute.index_lookup"
	SpanPick        = "kvroute.pick"
)

// kvroute's own attribute keys (those the GenAI conventions lack).
const (
	Worker        = attribute.Key("kvroute.worker")
	CachedTokens  = attribute.Key("kvroute.cached_tokens")
	PredictedTTFT = attribute.Key("kvroute.predicted_ttft_s")
	Reason        = attribute.Key("kvroute.reason")
	Degraded      = attribute.Key("kvroute.degraded")
	Outcome       = attribute.Key("kvroute.outcome")
	TokenizePath  = attribute.Key("kvroute.tokenize_path")
)

// HeaderGetter reads a request header by lower-case name ("" when absent).
type HeaderGetter func(name string) string

type getCarrier HeaderGetter

func (g getCarrier) Get(k string) string { return g(k) }
func (getCarrier) Set(string, string)    {}
func (getCarrier) Keys() []string        { return nil }

// Route is one request's kvroute.route span. A nil *Route is valid and does nothing,
// so callers need no checks.
type Route struct {
	ctx  context.Context
	span trace.Span
}

// StartRoute starts the route span as a child of the trace context in the request's
// headers (a new trace without one). api is the OpenAI/Anthropic API ("chat",
// "completions", "messages", "other"), used for gen_ai.operation.name.
func StartRoute(ctx context.Context, tr trace.Tracer, headers HeaderGetter, api string) *Route {
	if tr == nil {
		tr = Noop
	}
	ctx = Propagator.Extract(ctx, getCarrier(headers))
	op := map[string]string{"chat": "chat", "messages": "chat", "completions": "text_completion"}[api]
	attrs := []attribute.KeyValue{semconv.GenAIProviderNameKey.String("vllm")}
	if op != "" {
		attrs = append(attrs, semconv.GenAIOperationNameKey.String(op))
	}
	ctx, span := tr.Start(ctx, SpanRoute, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
	return &Route{ctx: ctx, span: span}
}

// Context carries the route span: pass it to router.Pick for the child spans.
func (r *Route) Context(fallback context.Context) context.Context {
	if r == nil {
		return fallback
	}
	return r.ctx
}

// Inject writes the route span's W3C context (traceparent, tracestate) through set,
// for the upstream request.
func (r *Route) Inject(set func(key, value string)) {
	if r == nil {
		return
	}
	Propagator.Inject(r.ctx, setCarrier(set))
}

type setCarrier func(key, value string)

func (setCarrier) Get(string) string { return "" }
func (s setCarrier) Set(k, v string) { s(k, v) }
func (setCarrier) Keys() []string    { return nil }

// Set adds attributes.
func (r *Route) Set(attrs ...attribute.KeyValue) {
	if r != nil {
		r.span.SetAttributes(attrs...)
	}
}

// Event records an event ("first_token", "completion") at t (zero → now).
func (r *Route) Event(name string, t time.Time, attrs ...attribute.KeyValue) {
	if r == nil {
		return
	}
	opts := []trace.EventOption{trace.WithAttributes(attrs...)}
	if !t.IsZero() {
		opts = append(opts, trace.WithTimestamp(t))
	}
	r.span.AddEvent(name, opts...)
}

// Fail marks the span failed with a short description (no prompt text).
func (r *Route) Fail(desc string) {
	if r != nil {
		r.span.SetStatus(codes.Error, desc)
	}
}

// End ends the span; later calls do nothing.
func (r *Route) End() {
	if r != nil {
		r.span.End()
	}
}

// Start starts a child span of ctx's span (the router's steps), with tr or Noop.
func Start(ctx context.Context, tr trace.Tracer, name string) (context.Context, trace.Span) {
	if tr == nil {
		tr = Noop
	}
	return tr.Start(ctx, name)
}

// Usage is the attributes of a completion's token usage (gen_ai.usage.*); a count
// below 0 (not reported) is left out.
func Usage(input, output int) []attribute.KeyValue {
	var out []attribute.KeyValue
	if input >= 0 {
		out = append(out, semconv.GenAIUsageInputTokensKey.Int(input))
	}
	if output >= 0 {
		out = append(out, semconv.GenAIUsageOutputTokensKey.Int(output))
	}
	return out
}

// Completed records the "completion" event with the HTTP status and the engine's
// usage (gen_ai.usage.*, when a usage object was seen); a status ≥ 400 fails the span.
func (r *Route) Completed(status int, u response.Usage) {
	if r == nil {
		return
	}
	if u.Present {
		r.Set(Usage(u.PromptTokens, u.CompletionTokens)...)
	}
	r.Event("completion", time.Time{}, attribute.Int("http.response.status_code", status))
	if status >= 400 {
		r.Fail(strconv.Itoa(status))
	}
}

// Model is gen_ai.request.model.
func Model(name string) attribute.KeyValue { return semconv.GenAIRequestModelKey.String(name) }
