package extproc

import (
	"log/slog"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/router"
)

// Options configures a Server.
type Options struct {
	Router  *router.Router
	Config  config.ExtProc
	Metrics *metrics.Set
	Logger  *slog.Logger
}

// Server implements envoy.service.ext_proc.v3.ExternalProcessor.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	opt Options
}

// New returns a Server.
func New(opt Options) *Server { return &Server{opt: opt} }

// Process implements the ext_proc bidirectional stream. (placeholder: the router-core
// issue replaces it with the full state machine)
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	return status.Error(codes.Unimplemented, "not yet")
}
