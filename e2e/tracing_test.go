package e2e

import (
	"context"
	"encoding/hex"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	"github.com/kvroute/kvroute/config"
)

// collector is an in-process OTLP/gRPC trace collector: it implements the documented
// opentelemetry.proto.collector.trace.v1.TraceService Export RPC and keeps every span.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []*tracepb.Span
	addr  string
}

func (c *collector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			c.spans = append(c.spans, ss.GetSpans()...)
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func startCollector(t *testing.T) *collector {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{addr: ln.Addr().String()}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, c)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return c
}

// route waits (generously: the batch exporter flushes every few seconds, and at
// shutdown) for a kvroute.route span of traceID and returns it with its children.
func (c *collector) route(t *testing.T, traceID string, children int) (*tracepb.Span, []*tracepb.Span) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		var root *tracepb.Span
		var kids []*tracepb.Span
		for _, s := range c.spans {
			if hex.EncodeToString(s.GetTraceId()) != traceID {
				continue
			}
			if s.GetName() == "kvroute.route" {
				root = s
			}
		}
		if root != nil {
			for _, s := range c.spans {
				if string(s.GetParentSpanId()) == string(root.GetSpanId()) {
					kids = append(kids, s)
				}
			}
		}
		c.mu.Unlock()
		if root != nil && len(kids) >= children {
			return root, kids
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no kvroute.route span with %d children for trace %s within 30 s", children, traceID)
	return nil, nil
}

func attr(s interface{ GetAttributes() []*commonpb.KeyValue }, key string) (*commonpb.AnyValue, bool) {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() == key {
			return kv.GetValue(), true
		}
	}
	return nil, false
}

// One request through each front produces the kvroute.route span as a child of the
// caller's traceparent, with children parse/tokenize/pick, the GenAI and kvroute
// attributes, first_token and completion events, and the worker receives a
// traceparent naming the route span.
func TestTracesOfOneRequestThroughEachFront(t *testing.T) {
	for _, front := range []string{"ext_proc", "proxy"} {
		t.Run(front, func(t *testing.T) {
			col := startCollector(t)
			f := newFixture(t, fixtureOpts{proxy: front == "proxy", envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed},
				cfg: func(c *config.Config) {
					c.Tracing = config.Tracing{Enabled: true, Protocol: "grpc", Endpoint: col.addr, Insecure: true, SampleRatio: 1}
				}})
			const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
			const parent = "00f067aa0ba902b7"
			st, _, body := f.do("POST", "/v1/chat/completions",
				`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}`,
				"traceparent", "00-"+traceID+"-"+parent+"-01")
			if st != 200 || !strings.Contains(body, "[DONE]") {
				t.Fatalf("status %d body %q", st, body)
			}
			// Flush: the App's shutdown flushes the batch exporter.
			root, kids := col.route(t, traceID, 0)
			if hex.EncodeToString(root.GetParentSpanId()) != parent {
				t.Fatalf("route span's parent %x, want the caller's %s", root.GetParentSpanId(), parent)
			}
			var served *testWorker
			for _, w := range f.workers {
				if h, _ := w.last(); h != nil {
					served = w
				}
			}
			if served == nil {
				t.Fatal("no worker saw the request")
			}
			h, _ := served.last()
			if tp := h.Get("traceparent"); tp != "00-"+traceID+"-"+hex.EncodeToString(root.GetSpanId())+"-01" {
				t.Fatalf("worker got traceparent %q, want the route span %x", tp, root.GetSpanId())
			}
			_, kids = col.route(t, traceID, 3)
			names := map[string]bool{}
			for _, k := range kids {
				names[k.GetName()] = true
			}
			for _, want := range []string{"kvroute.parse", "kvroute.tokenize", "kvroute.pick"} {
				if !names[want] {
					t.Errorf("route span lacks child %s (children %v)", want, names)
				}
			}
			if v, ok := attr(root, "gen_ai.request.model"); !ok || v.GetStringValue() != "m" {
				t.Errorf("gen_ai.request.model = %v", v)
			}
			if v, ok := attr(root, "kvroute.worker"); !ok || v.GetStringValue() != served.name {
				t.Errorf("kvroute.worker = %v, want %s", v, served.name)
			}
			if v, ok := attr(root, "gen_ai.operation.name"); !ok || v.GetStringValue() != "chat" {
				t.Errorf("gen_ai.operation.name = %v", v)
			}
			for _, k := range []string{"kvroute.reason", "kvroute.cached_tokens", "gen_ai.usage.output_tokens"} {
				if _, ok := attr(root, k); !ok {
					t.Errorf("route span lacks %s", k)
				}
			}
			events := map[string]bool{}
			for _, e := range root.GetEvents() {
				events[e.GetName()] = true
			}
			if !events["first_token"] || !events["completion"] {
				t.Errorf("route span events %v, want first_token and completion", events)
			}
		})
	}
}
