package e2e

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	mutationv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	extprocfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	earlyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"

	"github.com/kvroute/kvroute/envoy"
)

// shippedConfig reads what the stand-in imitates from a shipped bootstrap: the headers
// its early header mutation removes, ext_proc's failure_mode_allow and
// route_cache_action, so these tests follow the file, not a copy of it.
func shippedConfig(t *testing.T, file string) Config {
	t.Helper()
	b, err := envoy.LoadBootstrap("../envoy/" + file)
	if err != nil {
		t.Fatal(err)
	}
	var c Config
	err = envoy.Walk(b, func(m proto.Message, _ bool) error {
		switch x := m.(type) {
		case *earlyv3.HeaderMutation:
			for _, mu := range x.GetMutations() {
				if r, ok := mu.GetAction().(*mutationv3.HeaderMutation_Remove); ok {
					c.StripHeaders = append(c.StripHeaders, r.Remove)
				}
			}
		case *extprocfv3.ExternalProcessor:
			c.FailureModeAllow = x.GetFailureModeAllow()
			c.RouteCacheClear = x.GetRouteCacheAction() == extprocfv3.ExternalProcessor_CLEAR
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	c.RequestBodyMode, c.ResponseBodyMode = Buffered, Streamed
	return c
}

// namedWorkers starts n workers that answer with their own name and count hits.
func namedWorkers(t *testing.T, n int) (addrs []string, hits []*atomic.Int64) {
	t.Helper()
	for i := 0; i < n; i++ {
		name, h := string(rune('a'+i)), &atomic.Int64{}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.Add(1)
			io.Copy(io.Discard, r.Body)
			io.WriteString(w, name)
		}))
		t.Cleanup(srv.Close)
		addrs, hits = append(addrs, strings.TrimPrefix(srv.URL, "http://")), append(hits, h)
	}
	return addrs, hits
}

// post sends a chat request carrying a client-chosen destination header.
func postWithDestination(t *testing.T, url, dest string) string {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(chatNonStream))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-gateway-destination-endpoint", dest)
	req.Header.Set("x-gateway-destination-endpoint-served", dest)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d %q", resp.StatusCode, b)
	}
	return string(b)
}

// Issue 10 item 4: with kvroute down and ext_proc failing open, a client's own
// destination header is never honoured: the shipped configuration strips it and the
// request takes the load-balanced fallback route. The control case shows the threat:
// the same stand-in without the strip forwards to the client's choice.
func TestFailOpenNeverHonoursClientDestination(t *testing.T) {
	addrs, hits := namedWorkers(t, 3) // a, b serve the fallback; c is the client's target
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // kvroute is down: nothing listens on its ext_proc address
	for _, tc := range []struct {
		name  string
		strip bool
	}{{"shipped config", true}, {"control: no strip", false}} {
		t.Run(tc.name, func(t *testing.T) {
			for _, h := range hits {
				h.Store(0)
			}
			cfg := shippedConfig(t, "envoy-buffered.yaml")
			if !cfg.FailureModeAllow || len(cfg.StripHeaders) == 0 || !cfg.RouteCacheClear {
				t.Fatalf("premise: the BUFFERED bootstrap fails open, strips and clears the route: %+v", cfg)
			}
			if !tc.strip {
				cfg.StripHeaders = nil
			}
			cfg.ExtProcAddr, cfg.FallbackWorkers = dead, addrs[:2]
			e, err := New(generous(cfg))
			if err != nil {
				t.Fatal(err)
			}
			front := httptest.NewServer(e)
			defer func() { front.Close(); e.Close() }()
			for i := 0; i < 10; i++ {
				postWithDestination(t, front.URL, addrs[2])
			}
			if tc.strip {
				if hits[2].Load() != 0 || hits[0].Load()+hits[1].Load() != 10 || hits[0].Load() == 0 || hits[1].Load() == 0 {
					t.Fatalf("client-chosen worker got %d, fallback workers %d and %d; want 0 and the 10 spread", hits[2].Load(), hits[0].Load(), hits[1].Load())
				}
				if e.Stats().Fallbacks != 10 {
					t.Fatalf("fallbacks = %d, want 10", e.Stats().Fallbacks)
				}
			} else if hits[2].Load() != 10 {
				t.Fatalf("control: without the strip Envoy follows the client's header; the client's worker got %d of 10", hits[2].Load())
			}
		})
	}
}

// Issue 10 item 4, the other side: with kvroute up, its destination wins over the
// client's (stripped) one, through route_cache_action CLEAR; without CLEAR and without
// clear_route_cache the route cached before kvroute replied (the fallback) would stay.
func TestRouteReselectedAfterKVRouteReply(t *testing.T) {
	addrs, hits := namedWorkers(t, 3)
	chosen := addrs[1]
	p := scripted{reply: func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		switch req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
		case *extprocv3.ProcessingRequest_RequestBody:
			return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
				Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: mutation("x-gateway-destination-endpoint", "", chosen)}}}}}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
		case *extprocv3.ProcessingRequest_ResponseBody:
			return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
		}
		return nil
	}}
	for _, clear := range []bool{true, false} {
		cfg := shippedConfig(t, "envoy-buffered.yaml")
		cfg.FallbackWorkers, cfg.RouteCacheClear = []string{addrs[0]}, clear
		url := standIn(t, cfg, p)
		got := postWithDestination(t, url, addrs[2])
		want := map[bool]string{true: "b", false: "a"}[clear]
		if got != want {
			t.Fatalf("route_cache_action CLEAR=%v: served by %q, want %q", clear, got, want)
		}
	}
	if hits[2].Load() != 0 {
		t.Fatal("the client's destination was honoured")
	}
}
