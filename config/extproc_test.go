package config

import (
	"strings"
	"testing"
)

func TestExtProcValidate(t *testing.T) {
	if err := Default().ExtProc.validate(); err != nil {
		t.Fatalf("defaults must be valid: %v", err)
	}
	for _, c := range []struct {
		mut  func(*ExtProc)
		want string
	}{
		{func(e *ExtProc) { e.DestinationHeader = "" }, "extproc.destination_header"},
		{func(e *ExtProc) { e.DestinationHeader = "X-Upper" }, "extproc.destination_header"},
		{func(e *ExtProc) { e.DestinationHeader = "x-envoy-original-dst-host" }, "x-envoy-"},
		{func(e *ExtProc) { e.DestinationHeader = "transfer-encoding" }, "hop-by-hop"},
		{func(e *ExtProc) { e.WorkerHeader = "connection" }, "extproc.worker_header"},
		{func(e *ExtProc) { e.PredictedTTFTHeader = "content-length" }, "extproc.predicted_ttft_header"},
		{func(e *ExtProc) { e.SLOHeader = "bad header" }, "extproc.slo_header"},
		{func(e *ExtProc) { e.RequestBodyMode = "buffered-ish" }, "extproc.request_body_mode"},
		{func(e *ExtProc) { e.ResponseBodyMode = "" }, "extproc.response_body_mode"},
		{func(e *ExtProc) { e.MaxBodyBytes = 10 }, "extproc.max_body_bytes"},
	} {
		e := Default().ExtProc
		c.mut(&e)
		err := e.validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one naming %q", e, err, c.want)
		}
	}
}

func TestServerValidate(t *testing.T) {
	if err := Default().Server.validate(); err != nil {
		t.Fatal(err)
	}
	for _, mut := range []func(*Server){
		func(s *Server) { s.ExtProcAddr = "9002" },
		func(s *Server) { s.HealthAddr = "nope" },
		func(s *Server) { s.GRPCMaxRecvBytes = 1000 },
		func(s *Server) { s.ShutdownGrace = -1 },
	} {
		s := Default().Server
		mut(&s)
		if s.validate() == nil {
			t.Errorf("%+v must be invalid", s)
		}
	}
}
