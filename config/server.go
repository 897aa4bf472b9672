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
	// ReadyRequiresIndex holds readiness (GET /readyz, gRPC "readiness") until the KV
	// index has been in sync for at least one worker. Off by default: an idle vLLM
	// publishes no KV events, so a fleet with no traffic would never become ready.
	ReadyRequiresIndex bool `mapstructure:"ready_requires_index"`
}

func defaultServer() Server {
	return Server{ExtProcAddr: ":9002", HealthAddr: ":9003", AdminAddr: ":9090", ProxyAddr: ":8080",
		GRPCMaxRecvBytes: 64 << 20, ShutdownGrace: 15 * time.Second}
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
	return nil
}
