package tracing

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kvroute/kvroute/response"
)

func TestRouteContinuesAndInjectsW3CContext(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	hdr := map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	r := StartRoute(context.Background(), tp.Tracer("t"), func(k string) string { return hdr[k] }, "completions")
	_, child := Start(r.Context(context.Background()), tp.Tracer("t"), SpanPick)
	child.End()
	out := map[string]string{}
	r.Inject(func(k, v string) { out[k] = v })
	r.Completed(503, response.Usage{Present: true, PromptTokens: 7, CompletionTokens: 0})
	r.End()
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans ended, want pick and route", len(spans))
	}
	route, pick := spans[1], spans[0]
	if route.Name() != SpanRoute || route.Parent().SpanID().String() != "00f067aa0ba902b7" || route.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("route span %s parent %s trace %s", route.Name(), route.Parent().SpanID(), route.SpanContext().TraceID())
	}
	if pick.Parent().SpanID() != route.SpanContext().SpanID() {
		t.Fatal("pick is not a child of the route span")
	}
	if want := "00-4bf92f3577b34da6a3ce929d0e0e4736-" + route.SpanContext().SpanID().String() + "-01"; out["traceparent"] != want {
		t.Fatalf("injected %q, want %q", out["traceparent"], want)
	}
	if route.Status().Code.String() != "Error" {
		t.Fatalf("a 503 completion left status %v", route.Status())
	}
	got := map[string]int64{}
	for _, a := range route.Attributes() {
		got[string(a.Key)] = a.Value.AsInt64()
	}
	if got["gen_ai.usage.input_tokens"] != 7 {
		t.Fatalf("attributes %v", route.Attributes())
	}
}

// A nil Route (no span started) is safe to use everywhere.
func TestNilRoute(t *testing.T) {
	var r *Route
	ctx := context.Background()
	if r.Context(ctx) != ctx {
		t.Fatal("nil route changed the context")
	}
	r.Set()
	r.Event("x", time.Time{})
	r.Inject(func(string, string) { t.Fatal("nil route injected") })
	r.Completed(200, response.Usage{})
	r.Fail("x")
	r.End()
}
