package extproc

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// harness is the one test fixture: a Server over a real gRPC server on an in-memory
// listener, two workers (w1 10.0.0.1:8000, w2 10.0.0.2:8000) serving model "m".
// Options tweak the config or the policy; please do not add sibling constructors.
type harness struct {
	t      *testing.T
	reg    *workers.Registry
	router *router.Router
	srv    *Server // set srv.opt fields (Admission) before opening a stream
	ms     *metrics.Set
	client extprocv3.ExternalProcessorClient
	ended  chan error           // one value per finished Process call, its return value
	ctxs   chan context.Context // each Process call's stream context, as it starts
}

type harnessOpt func(*config.ExtProc, *router.Options)

func newHarness(t testing.TB, opts ...harnessOpt) *harness {
	t.Helper()
	cfg := config.Default().ExtProc
	reg := workers.NewRegistry()
	ms := metrics.NewUnregistered()
	ro := router.Options{Registry: reg, Models: []router.Model{{Name: "m"}}, Metrics: ms}
	for _, o := range opts {
		o(&cfg, &ro)
	}
	reg.Set([]*workers.Worker{
		{Name: "w1", Address: "10.0.0.1:8000", Models: []string{"m"}},
		{Name: "w2", Address: "10.0.0.2:8000", Models: []string{"m"}},
	})
	r := router.New(ro)
	ln := bufconn.Listen(1 << 20)
	ended := make(chan error, 1024)
	ctxs := make(chan context.Context, 1024)
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(64<<20), grpc.StreamInterceptor(
		func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			select {
			case ctxs <- ss.Context():
			default:
			}
			err := handler(srv, ss)
			select {
			case ended <- err:
			default:
			}
			return err
		}))
	eps := New(Options{Router: r, Config: cfg, Metrics: ms})
	extprocv3.RegisterExternalProcessorServer(srv, eps)
	go srv.Serve(ln)
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); srv.Stop() })
	h := &harness{reg: reg, router: r, srv: eps, ms: ms, client: extprocv3.NewExternalProcessorClient(conn), ended: ended, ctxs: ctxs}
	if tt, ok := t.(*testing.T); ok {
		h.t = tt
	}
	return h
}

// waitEnded waits until one server-side stream has returned and gives its error.
func (h *harness) waitEnded(t testing.TB) error {
	t.Helper()
	select {
	case err := <-h.ended:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("server stream did not end")
		return nil
	}
}

// tstream is one scripted Envoy stream.
type tstream struct {
	t      testing.TB
	s      extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
}

func (h *harness) open(t testing.TB) *tstream {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	s, err := h.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cancel)
	return &tstream{t: t, s: s, cancel: cancel}
}

func (s *tstream) send(reqs ...*extprocv3.ProcessingRequest) {
	s.t.Helper()
	for _, r := range reqs {
		if err := s.s.Send(r); err != nil {
			s.t.Fatalf("send: %v", err)
		}
	}
}

func (s *tstream) recv() *extprocv3.ProcessingResponse {
	s.t.Helper()
	r, err := s.s.Recv()
	if err != nil {
		s.t.Fatalf("recv: %v", err)
	}
	return r
}

// ---- message builders (Envoy's shape: lower-case keys, raw_value, pseudo-headers) ----

func hdrs(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	hm := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: strings.ToLower(kv[i]), RawValue: []byte(kv[i+1])})
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: eos}}}
}

func post(path string, extra ...string) []string {
	return append([]string{":method", "POST", ":path", path, ":authority", "gw", ":scheme", "http", "content-type", "application/json"}, extra...)
}

func withPC(r *extprocv3.ProcessingRequest, req, resp procmodev3.ProcessingMode_BodySendMode) *extprocv3.ProcessingRequest {
	r.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: req, ResponseBodyMode: resp}
	return r
}

func body(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos}}}
}

func rspHdrs(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	r := hdrs(eos, kv...)
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: r.GetRequestHeaders()}}
}

func rspBody(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos}}}
}

func reqTrailers() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{Trailers: &corev3.HeaderMap{}}}}
}

func rspTrailers() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{Trailers: &corev3.HeaderMap{}}}}
}

// ---- reply inspection ----

// destOf returns the destination header set by a mutation ("" none) and whether it
// was set the way Envoy honours it (raw_value only, append unset or false).
func destOf(t testing.TB, m *extprocv3.HeaderMutation, name string) string {
	t.Helper()
	for _, o := range m.GetSetHeaders() {
		if o.GetHeader().GetKey() != name {
			continue
		}
		if o.GetHeader().GetValue() != "" {
			t.Errorf("header %s set with value %q: Envoy reads raw_value only and rejects both (envoy#31555)", name, o.GetHeader().GetValue())
		}
		if o.GetAppend().GetValue() {
			t.Errorf("header %s set with append=true: a client-supplied value would survive", name)
		}
		return string(o.GetHeader().GetRawValue())
	}
	return ""
}

func metaDest(r *extprocv3.ProcessingResponse) string {
	return r.GetDynamicMetadata().GetFields()["envoy.lb"].GetStructValue().GetFields()["x-gateway-destination-endpoint"].GetStringValue()
}

const chatBody = `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}`

const sse = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
	"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n" +
	"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"

// shedPolicy refuses everything (a policy returning Shed → 429).
type shedPolicy struct{}

func (shedPolicy) Name() string { return "shed" }
func (shedPolicy) Pick(*scoring.Input, []scoring.Candidate) scoring.Decision {
	return scoring.Decision{Index: -1, Shed: true, RetryAfter: 1500 * time.Millisecond}
}
