package extproc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime/debug"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/router"
	"go.opentelemetry.io/otel/trace"
)

// Options configures a Server.
type Options struct {
	Router  *router.Router // required
	Config  config.ExtProc // zero fields are NOT defaulted: pass config.Default().ExtProc as a base
	Metrics *metrics.Set   // nil: an unregistered set
	Logger  *slog.Logger   // nil: slog.Default()
	Tracer  trace.Tracer   // kvroute.route spans (package tracing); nil: none
}

// Server implements envoy.service.ext_proc.v3.ExternalProcessor. One Process call
// serves one HTTP request (Envoy opens one stream per request and never reuses it).
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	opt      Options
	m        *metrics.ExtProc
	log      *slog.Logger
	reqMode  mode // assumed when Envoy sends no protocol_config
	respMode mode
}

// New returns a Server.
func New(opt Options) *Server {
	if opt.Metrics == nil {
		opt.Metrics = metrics.NewUnregistered()
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.Config.DestinationHeader == "" {
		opt.Config.DestinationHeader = config.Default().ExtProc.DestinationHeader
	}
	if opt.Config.MaxBodyBytes <= 0 {
		opt.Config.MaxBodyBytes = config.Default().ExtProc.MaxBodyBytes
	}
	return &Server{opt: opt, m: opt.Metrics.ExtProc, log: opt.Logger,
		reqMode: parseMode(opt.Config.RequestBodyMode, modeBuffered), respMode: parseMode(opt.Config.ResponseBodyMode, modeStreamed)}
}

// Process runs one ext_proc stream: one loop, one type switch over the message (in
// stream.handle), one method per phase. It returns nil when Envoy ends the stream
// (EOF or cancel, the normal ends: reference §5.5), and never panics: a panic is
// recovered, counted, the ticket aborted, and the stream failed with INTERNAL (Envoy
// then answers 500, or continues when failure_mode_allow is set).
func (s *Server) Process(ps extprocv3.ExternalProcessor_ProcessServer) (err error) {
	st := newStream(s, ps.Context(), ps.Send)
	defer func() { st.route.End() }()
	s.m.ActiveStreams.Inc()
	defer s.m.ActiveStreams.Dec()
	defer func() {
		if p := recover(); p != nil {
			s.m.Panics.Inc()
			s.m.PhaseErrors.WithLabelValues(string(st.phase), "panic").Inc()
			s.log.Error("ext_proc: panic", "phase", st.phase, "request_id", st.requestID, "panic", p, "stack", string(debug.Stack()))
			st.finish("panic")
			err = status.Error(codes.Internal, "kvroute: internal error")
		}
	}()
	for {
		req, rerr := ps.Recv()
		if rerr != nil {
			return st.closed(rerr)
		}
		t0 := time.Now()
		if herr := st.handle(req); herr != nil {
			st.finish("send_error")
			return herr
		}
		if st.replied {
			s.m.OverheadSeconds.WithLabelValues(string(st.phase)).Observe(time.Since(t0).Seconds())
		}
	}
}

// closed handles the end of the stream as Recv reported it. io.EOF is Envoy's
// half-close (graceful close, runtime ext_proc_graceful_grpc_close); Canceled is its
// default half-close plus RST_STREAM (GC close(); envoyproxy/envoy#38195). Either
// before completion means the request was abandoned: the ticket is aborted.
func (st *stream) closed(err error) error {
	switch {
	case errors.Is(err, io.EOF):
		st.finish("closed")
		return nil
	case errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled:
		st.finish("cancelled")
		return nil
	case errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded:
		st.finish("cancelled")
		return nil
	}
	st.s.m.PhaseErrors.WithLabelValues("stream", "recv").Inc()
	st.s.log.Debug("ext_proc: recv", "request_id", st.requestID, "err", err)
	st.finish("recv_error")
	return err
}
