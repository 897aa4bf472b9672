package extproc

import (
	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/classify"

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
	// Admission is the admission stage (tenant identity, budgets); nil admits every
	// request as unattributed. The tenant header is believed as set by the edge: the
	// Envoy configuration must remove the client's copy (docs/configuration.md).
	Admission *admission.Admitter
	// Classify is the classify stage (rules over what the request says); nil: off.
	Classify *classify.Rules
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
	streams  chan struct{} // one slot per open stream (extproc.max_streams)
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
	if opt.Config.MaxStreams <= 0 {
		opt.Config.MaxStreams = config.Default().ExtProc.MaxStreams
	}
	return &Server{opt: opt, m: opt.Metrics.ExtProc, log: opt.Logger,
		reqMode: parseMode(opt.Config.RequestBodyMode, modeBuffered), respMode: parseMode(opt.Config.ResponseBodyMode, modeStreamed),
		streams: make(chan struct{}, opt.Config.MaxStreams)}
}

// Process runs one ext_proc stream: one loop, one type switch over the message (in
// stream.handle), one method per phase. It returns nil when Envoy ends the stream
// (EOF or cancel, the normal ends: reference §5.5), and never panics: a panic is
// recovered, counted, the ticket aborted, and the stream failed with INTERNAL (Envoy
// then answers 500, or continues when failure_mode_allow is set).
//
// Limits: at most extproc.max_streams streams are open at once (a
// stream over it fails at once with RESOURCE_EXHAUSTED, before any booking), and one
// stream may send at most extproc.max_messages_per_second messages (token bucket with a
// burst of one second's worth); over it the stream fails with RESOURCE_EXHAUSTED and its
// ticket is aborted.
func (s *Server) Process(ps extprocv3.ExternalProcessor_ProcessServer) (err error) {
	select {
	case s.streams <- struct{}{}:
		defer func() { <-s.streams }()
	default:
		s.m.StreamsRefused.WithLabelValues("max_streams").Inc()
		return status.Errorf(codes.ResourceExhausted, "kvroute: %d ext_proc streams already open (extproc.max_streams)", cap(s.streams))
	}
	st := newStream(s, ps.Context(), ps.Send)
	rate := newBucket(s.opt.Config.MaxMessagesPerSecond)
	defer func() { st.route.End() }()
	s.m.ActiveStreams.Inc()
	defer s.m.ActiveStreams.Dec()
	defer st.recordEnd() // after the panic recovery below has aborted the ticket
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
		if !rate.take(t0) {
			s.m.StreamsRefused.WithLabelValues("message_rate").Inc()
			st.finish("message_rate")
			return status.Errorf(codes.ResourceExhausted, "kvroute: more than %g ext_proc messages per second on one stream (extproc.max_messages_per_second)", s.opt.Config.MaxMessagesPerSecond)
		}
		if herr := st.handle(req); herr != nil {
			if st.ctx.Err() != nil {
				// Envoy cancelled the stream (client gone) while kvroute was replying:
				// the send failed because of the cancel, so it is one.
				st.finish("cancelled")
				return nil
			}
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

// bucket is a token bucket of rate tokens per second holding at most rate tokens
// (rate ≤ 0: unlimited). Owned by one stream's goroutine.
type bucket struct {
	rate, tokens float64
	last         time.Time
}

func newBucket(rate float64) *bucket { return &bucket{rate: rate, tokens: rate} }

// take spends one token at now; false when none is left.
func (b *bucket) take(now time.Time) bool {
	if b.rate <= 0 {
		return true
	}
	if !b.last.IsZero() {
		b.tokens = min(b.rate, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
