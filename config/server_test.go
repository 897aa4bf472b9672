package config

import (
	"strings"
	"testing"
)

// Issue 11 item 14: a gRPC receive limit at or below the body limit is refused at start,
// naming both keys and both values.
func TestGRPCMaxRecvMustExceedMaxBody(t *testing.T) {
	_, err := Load(nil, env(map[string]string{
		"KVROUTE_SERVER_GRPC_MAX_RECV_BYTES": "4194304",
		"KVROUTE_EXTPROC_MAX_BODY_BYTES":     "16777216",
	}))
	if err == nil {
		t.Fatal("4 MiB gRPC limit with a 16 MiB body limit must be refused")
	}
	for _, want := range []string{"server.grpc_max_recv_bytes", "extproc.max_body_bytes", "4194304", "16777216"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error must name %q: %v", want, err)
		}
	}
	if _, err := Load(nil, env(map[string]string{"KVROUTE_SERVER_GRPC_MAX_RECV_BYTES": "16777217", "KVROUTE_EXTPROC_MAX_BODY_BYTES": "16777216"})); err != nil {
		t.Fatalf("one byte above the body limit is valid: %v", err)
	}
}

func TestServerTimeoutsAndTLSValidated(t *testing.T) {
	for _, tc := range []struct{ key, val, want string }{
		{"KVROUTE_SERVER_HTTP_IDLE_TIMEOUT", "0s", "server.http_idle_timeout"},
		{"KVROUTE_SERVER_HTTP_BODY_TIMEOUT", "0s", "server.http_body_timeout"},
		{"KVROUTE_SERVER_EXT_PROC_TLS_CERT", "/x.pem", "ext_proc_tls_key"},
		{"KVROUTE_SERVER_EXT_PROC_TLS_CLIENT_CA", "/ca.pem", "server.ext_proc_tls_client_ca"},
		{"KVROUTE_EXTPROC_MAX_STREAMS", "0", "extproc.max_streams"},
		{"KVROUTE_PROXY_PATHS", "[v1/chat]", "proxy.paths"},
		{"KVROUTE_PROXY_UPSTREAM_IDLE_TIMEOUT", "0s", "proxy.upstream_idle_timeout"},
	} {
		_, err := Load(nil, env(map[string]string{tc.key: tc.val}))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s=%s: want an error naming %s, got %v", tc.key, tc.val, tc.want, err)
		}
	}
	c := Default()
	if c.Server.AdminAddr != "127.0.0.1:9090" {
		t.Errorf("the admin port defaults to loopback, got %q", c.Server.AdminAddr)
	}
}
