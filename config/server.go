package config

import (
	"net"
	"time"
)

// Server holds the listen addresses.
type Server struct {
	ExtProcAddr string `mapstructure:"ext_proc_addr"` // gRPC ext_proc listener
	HealthAddr  string `mapstructure:"health_addr"`   // gRPC health listener ("" = serve health on ext_proc_addr only)
	AdminAddr   string `mapstructure:"admin_addr"`    // HTTP admin: /metrics, /healthz, /readyz, /debug/*
	ProxyAddr   string `mapstructure:"proxy_addr"`    // HTTP listener of `kvroute proxy`
	// GRPCMaxRecvBytes bounds one ext_proc message; BUFFERED bodies arrive whole, so it
	// must exceed extproc.max_body_bytes (Go gRPC's 4 MiB default breaks big prompts:
	// envoyproxy/ai-gateway#1209).
	GRPCMaxRecvBytes int           `mapstructure:"grpc_max_recv_bytes"`
	ShutdownGrace    time.Duration `mapstructure:"shutdown_grace"` // time to drain on SIGTERM

	// HTTP server timeouts, applied to every HTTP server kvroute starts (proxy, admin).
	// HTTPReadHeaderTimeout bounds reading a request's headers (slowloris).
	HTTPReadHeaderTimeout time.Duration `mapstructure:"http_read_header_timeout"`
	// HTTPBodyTimeout bounds reading one request body, from the end of its headers
	// (a trickled body is cut and answered 408). A body-read deadline, not
	// http.Server.ReadTimeout: that one would also cut a long SSE response, because the
	// server's background read (client-gone detection) hits it and cancels the request.
	HTTPBodyTimeout time.Duration `mapstructure:"http_body_timeout"`
	// HTTPIdleTimeout closes a keep-alive connection idle for this long.
	HTTPIdleTimeout time.Duration `mapstructure:"http_idle_timeout"`
	// HTTPWriteTimeout bounds one response on the admin server (http.Server.WriteTimeout)
	// and, on the proxy, one write to the client: a client that stops reading an SSE
	// stream for this long is cut (a whole-response timeout would cut long generations).
	HTTPWriteTimeout time.Duration `mapstructure:"http_write_timeout"`

	// AdminToken, when set, is required as "Authorization: Bearer TOKEN" on /debug/*
	// (401 otherwise). /metrics, /healthz and /readyz stay open for probes and scrapers.
	AdminToken string `mapstructure:"admin_token"`
	// AdminExplainMaxBodyBytes bounds the body of GET /debug/explain (413 above).
	AdminExplainMaxBodyBytes int `mapstructure:"admin_explain_max_body_bytes"`
	// AdminExplainConcurrency bounds concurrent /debug/explain calls, and with them the
	// remote POST /tokenize calls they may make (429 above).
	AdminExplainConcurrency int `mapstructure:"admin_explain_concurrency"`

	// ExtProcTLSCert and ExtProcTLSKey (PEM files) serve the ext_proc gRPC listener over
	// TLS; ExtProcTLSClientCA (PEM) additionally requires and verifies client
	// certificates (mTLS). "" = plaintext (the listener must then be reachable by Envoy
	// only). The gRPC health listener on server.health_addr stays plaintext.
	ExtProcTLSCert     string `mapstructure:"ext_proc_tls_cert"`
	ExtProcTLSKey      string `mapstructure:"ext_proc_tls_key"`
	ExtProcTLSClientCA string `mapstructure:"ext_proc_tls_client_ca"`
	// ReadyRequiresIndex holds readiness (GET /readyz, gRPC "readiness") until the KV
	// index has been in sync for at least one worker. Off by default: an idle vLLM
	// publishes no KV events, so a fleet with no traffic would never become ready.
	ReadyRequiresIndex bool `mapstructure:"ready_requires_index"`
}

func defaultServer() Server {
	return Server{ExtProcAddr: ":9002", HealthAddr: ":9003", AdminAddr: "127.0.0.1:9090", ProxyAddr: ":8080",
		GRPCMaxRecvBytes: 64 << 20, ShutdownGrace: 15 * time.Second,
		HTTPReadHeaderTimeout: 10 * time.Second, HTTPBodyTimeout: 60 * time.Second, HTTPIdleTimeout: 120 * time.Second,
		HTTPWriteTimeout: 60 * time.Second, AdminExplainMaxBodyBytes: 1 << 20, AdminExplainConcurrency: 2}
}

func (s Server) validate() error {
	for _, a := range []struct{ key, v string }{{"server.ext_proc_addr", s.ExtProcAddr}, {"server.admin_addr", s.AdminAddr}, {"server.proxy_addr", s.ProxyAddr}} {
		if _, _, err := net.SplitHostPort(a.v); err != nil {
			return fieldErr(a.key, "%q is not a host:port listen address", a.v)
		}
	}
	if s.HealthAddr != "" {
		if _, _, err := net.SplitHostPort(s.HealthAddr); err != nil {
			return fieldErr("server.health_addr", "%q is not a host:port listen address", s.HealthAddr)
		}
	}
	if s.GRPCMaxRecvBytes < 1<<20 {
		return fieldErr("server.grpc_max_recv_bytes", "must be ≥ 1048576 (1 MiB), got %d", s.GRPCMaxRecvBytes)
	}
	if s.ShutdownGrace < 0 {
		return fieldErr("server.shutdown_grace", "must be ≥ 0, got %s", s.ShutdownGrace)
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"server.http_read_header_timeout", s.HTTPReadHeaderTimeout}, {"server.http_body_timeout", s.HTTPBodyTimeout},
		{"server.http_idle_timeout", s.HTTPIdleTimeout}, {"server.http_write_timeout", s.HTTPWriteTimeout}} {
		if d.v <= 0 {
			return fieldErr(d.key, "must be > 0 (every HTTP server has timeouts), got %s", d.v)
		}
	}
	if s.AdminExplainMaxBodyBytes < 1024 {
		return fieldErr("server.admin_explain_max_body_bytes", "must be ≥ 1024, got %d", s.AdminExplainMaxBodyBytes)
	}
	if s.AdminExplainConcurrency < 1 {
		return fieldErr("server.admin_explain_concurrency", "must be ≥ 1, got %d", s.AdminExplainConcurrency)
	}
	if (s.ExtProcTLSCert == "") != (s.ExtProcTLSKey == "") {
		return fieldErr("server.ext_proc_tls_cert", "ext_proc_tls_cert and ext_proc_tls_key are set together (got cert %q, key %q)", s.ExtProcTLSCert, s.ExtProcTLSKey)
	}
	if s.ExtProcTLSClientCA != "" && s.ExtProcTLSCert == "" {
		return fieldErr("server.ext_proc_tls_client_ca", "mTLS needs ext_proc_tls_cert and ext_proc_tls_key too")
	}
	return nil
}

// validateBodyFitsGRPC: a BUFFERED body arrives in one ext_proc message, so the gRPC
// receive limit must exceed the body limit; otherwise a body between the two gets
// Envoy's opaque 500 (the gRPC stream fails) instead of kvroute's 413.
func validateBodyFitsGRPC(s Server, e ExtProc) error {
	if s.GRPCMaxRecvBytes <= e.MaxBodyBytes {
		return fieldErr("server.grpc_max_recv_bytes", "must exceed extproc.max_body_bytes (a BUFFERED body arrives in one gRPC message): server.grpc_max_recv_bytes is %d, extproc.max_body_bytes is %d", s.GRPCMaxRecvBytes, e.MaxBodyBytes)
	}
	return nil
}
