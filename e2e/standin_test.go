package e2e

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/kvroute/kvroute/config"
)

// These tests pin the stand-in's own fidelity against scripted processors, so that
// the end-to-end tests above can trust it.

// scripted is a processor answering each message with reply(req) (nil: no answer).
type scripted struct {
	extprocv3.UnimplementedExternalProcessorServer
	reply func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse
}

func (s scripted) Process(ps extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := ps.Recv()
		if err != nil {
			return nil
		}
		if r := s.reply(req); r != nil {
			if err := ps.Send(r); err != nil {
				return err
			}
		}
	}
}

func standIn(t *testing.T, cfg Config, p scripted) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(srv, p)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	cfg.ExtProcAddr = ln.Addr().String()
	e, err := New(generous(cfg))
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(e)
	t.Cleanup(func() { front.Close(); e.Close() })
	return front.URL
}

func get(t *testing.T, url string) (*http.Response, string) {
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatNonStream))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b := new(bytes.Buffer)
	_, _ = b.ReadFrom(resp.Body)
	return resp, b.String()
}

// message_timeout (default 200 ms) expiry → 504 (CC onMessageTimeout).
func TestStandInMessageTimeout504(t *testing.T) {
	url := standIn(t, Config{RequestBodyMode: Buffered, MessageTimeout: 50 * time.Millisecond},
		scripted{reply: func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse { return nil }})
	if resp, _ := get(t, url); resp.StatusCode != 504 {
		t.Fatalf("status %d, want 504", resp.StatusCode)
	}
}

// A reply of the wrong kind is spurious → 500 (PS; §3.1, §3.7).
func TestStandInSpuriousReply500(t *testing.T) {
	url := standIn(t, Config{RequestBodyMode: Buffered}, scripted{reply: func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}
	}})
	if resp, _ := get(t, url); resp.StatusCode != 500 {
		t.Fatalf("status %d, want 500", resp.StatusCode)
	}
}

// No destination (header missing) → the router's 503 "no healthy upstream" (OD; RT).
// Also: x-envoy-* mutations are silently dropped by the default rules (MR), and a
// value-only mutation is an empty header (envoy#31555) — both route nowhere.
func TestStandInNoDestination503(t *testing.T) {
	for _, set := range []struct{ key, value, raw string }{
		{"x-gateway-destination-endpoint", "", ""},
		{"x-envoy-original-dst-host", "", "127.0.0.1:1"},
		{"x-gateway-destination-endpoint", "127.0.0.1:1", ""},
		{"x-gateway-destination-endpoint", "", "localhost:80"},
		{"x-gateway-destination-endpoint", "", "127.0.0.1:1,127.0.0.1:2"},
	} {
		url := standIn(t, Config{RequestBodyMode: None, DestinationHeader: map[bool]string{true: "x-envoy-original-dst-host"}[strings.HasPrefix(set.key, "x-envoy")]},
			scripted{reply: func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
				return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
					Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: mutation(set.key, set.value, set.raw)}}}}}
			}})
		resp, body := get(t, url)
		if resp.StatusCode != 503 || body != "no healthy upstream" {
			t.Fatalf("%+v: status %d body %q, want 503 no healthy upstream", set, resp.StatusCode, body)
		}
	}
}

// A clean close (OK) by the processor: Envoy continues without it (CC onGrpcClose) —
// here with no destination, so the router answers 503.
func TestStandInCleanCloseContinues(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(srv, closer{})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	e, err := New(generous(Config{ExtProcAddr: ln.Addr().String(), RequestBodyMode: Buffered}))
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(e)
	t.Cleanup(func() { front.Close(); e.Close() })
	if resp, body := get(t, front.URL); resp.StatusCode != 503 || body != "no healthy upstream" {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
}

type closer struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (closer) Process(extprocv3.ExternalProcessor_ProcessServer) error { return nil }

// FULL_DUPLEX_STREAMED requires trailer mode SEND (CFG verifyProcessingModeConfig).
func TestStandInRejectsDuplexWithoutTrailers(t *testing.T) {
	if _, err := New(Config{ExtProcAddr: "127.0.0.1:1", RequestBodyMode: FullDuplex}); err == nil {
		t.Fatal("config must be rejected")
	}
}

// kvroute writing a different header than the cluster reads: 503 end to end.
func TestMisconfiguredHeaderName503(t *testing.T) {
	f := newFixture(t, fixtureOpts{envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed},
		cfg: func(c *config.Config) { c.ExtProc.DestinationHeader = "x-other"; c.ExtProc.MetadataNamespace = "" }})
	st, _, body := f.do("POST", "/v1/chat/completions", chatNonStream)
	if st != 503 || body != "no healthy upstream" {
		t.Fatalf("status %d body %q", st, body)
	}
	if f.envoy.Stats().NoHealthyUpstream != 1 {
		t.Fatal("want one no-healthy-upstream")
	}
	// Envoy's local reply is not sent to the processor (§2.1): the ticket is only
	// released when the stream is reset.
	f.waitInFlight(0)
}

func mutation(key, value, raw string) []*corev3.HeaderValueOption {
	return []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: key, Value: value, RawValue: []byte(raw)}}}
}
