// Package proxy is `kvroute proxy`: a plain OpenAI-compatible reverse proxy over the
// same router core, for running without Envoy. It reads the body (bounded by
// extproc.max_body_bytes), parses it (package request), picks and books a worker
// (router.Pick), forwards the request there with net/http/httputil.ReverseProxy,
// streams the response back without buffering (SSE flushes every write), and watches
// the body with response.Tracker exactly as the ext_proc path does: first generated
// token → Ticket.FirstToken, end of body → Ticket.Done with usage, client disconnect
// or upstream failure → Ticket.Abort. A worker that refuses the connection is marked
// unhealthy (passive health) and the request retried once on another pick. Refusals use
// router.ErrorReply, the mapping the ext_proc server uses, so both fronts answer the
// same status and error JSON.
package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tracing"
	"go.opentelemetry.io/otel/trace"
)

// Options configures a Handler.
type Options struct {
	Router  *router.Router // required
	Config  config.ExtProc // destination/SLO/worker/predicted-TTFT headers and max_body_bytes
	Metrics *metrics.Set   // nil: an unregistered set
	Logger  *slog.Logger   // nil: slog.Default()
	// Transport carries requests to workers; nil: a clone of http.DefaultTransport.
	Transport http.RoundTripper
	// NoPassiveHealth keeps a worker whose connection failed healthy (the request is still
	// retried once elsewhere). Set it when nothing would mark the worker healthy again:
	// only the /metrics scraper (scoring.scrape.interval > 0) revives workers.
	NoPassiveHealth bool
	// Tracer starts each request's kvroute.route span (package tracing); nil: none.
	Tracer trace.Tracer
}

type handler struct {
	opt Options
	m   *metrics.ExtProc
	log *slog.Logger
	rp  *httputil.ReverseProxy
}

// New returns the proxy handler.
func New(opt Options) http.Handler {
	if opt.Metrics == nil {
		opt.Metrics = metrics.NewUnregistered()
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.Config.MaxBodyBytes <= 0 {
		opt.Config.MaxBodyBytes = config.Default().ExtProc.MaxBodyBytes
	}
	if opt.Transport == nil {
		opt.Transport = http.DefaultTransport.(*http.Transport).Clone()
	}
	h := &handler{opt: opt, m: opt.Metrics.ExtProc, log: opt.Logger}
	h.rp = &httputil.ReverseProxy{
		Rewrite:        h.rewrite,
		ModifyResponse: h.modifyResponse,
		ErrorHandler:   h.errorHandler,
		Transport:      opt.Transport,
		// -1: flush after every write, so SSE events reach the client as the worker
		// produces them (a non-negative interval would batch tokens).
		FlushInterval: -1,
		ErrorLog:      slog.NewLogLogger(opt.Logger.Handler(), slog.LevelDebug),
	}
	return h
}

// flight is one proxied request's state, carried in the request context from
// ServeHTTP to the ReverseProxy hooks. All hooks run on the handler's goroutine.
type flight struct {
	ticket   *router.Ticket
	req      *request.Request
	route    *tracing.Route
	ended    bool // Done or Abort called
	mayRetry bool // first attempt: a connect failure may be retried on another worker
	retry    bool // set by errorHandler: nothing was written, pick again
}

type flightKey struct{}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &statusRecorder{ResponseWriter: w}
	var f *flight
	api := request.APIForPath(r.URL.Path)
	route := tracing.StartRoute(r.Context(), h.opt.Tracer, r.Header.Get, string(api))
	defer route.End()
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			h.m.Panics.Inc()
			h.log.Error("proxy: panic", "panic", p, "stack", string(debug.Stack()))
			if rec.status == 0 {
				h.writeError(rec, fmt.Errorf("panic: %v", p))
			}
		}
		if f != nil && !f.ended {
			h.abort(f, "client_gone")
		}
		h.m.ProxyRequests.WithLabelValues(statusClass(rec.status)).Inc()
	}()
	ctx := route.Context(r.Context())
	_, span := tracing.Start(ctx, h.opt.Tracer, tracing.SpanParse)
	body, err := readBody(r, h.opt.Config.MaxBodyBytes)
	var req *request.Request
	if err == nil {
		req, err = request.Parse(api, body)
	}
	span.End()
	if err != nil {
		route.Fail("request refused")
		h.writeError(rec, err)
		return
	}
	route.Set(tracing.Model(req.Model))
	po := router.PickOptions{RequestID: r.Header.Get("X-Request-Id"), SLO: h.slo(r)}
	// At most two attempts: a worker that refuses the connection is marked unhealthy
	// (unless passive health is off) and the request, of which nothing was sent, is
	// picked again among the other workers (see errorHandler).
	for attempt := 0; attempt < 2; attempt++ {
		t, err := h.opt.Router.Pick(ctx, req, po)
		if err != nil {
			route.Fail("no pick")
			h.writeError(rec, err)
			return
		}
		route.Set(t.TraceAttributes()...)
		f = &flight{ticket: t, req: req, route: route, mayRetry: attempt == 0}
		out := r.WithContext(context.WithValue(r.Context(), flightKey{}, f))
		out.Body = io.NopCloser(bytes.NewReader(body))
		out.ContentLength = int64(len(body))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		h.rp.ServeHTTP(rec, out)
		if !f.retry {
			return
		}
		po.Exclude = t.Worker // never retry on the worker that refused the connection
	}
}

// readBody reads at most limit bytes; a longer body is a 413.
func readBody(r *http.Request, limit int) ([]byte, error) {
	if r.ContentLength > int64(limit) {
		return nil, request.TooLarge(limit)
	}
	n := 0
	if r.ContentLength > 0 {
		n = int(r.ContentLength)
	}
	buf := bytes.NewBuffer(make([]byte, 0, n+1))
	if _, err := buf.ReadFrom(io.LimitReader(r.Body, int64(limit)+1)); err != nil {
		return nil, &request.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Message: "reading the request body: " + err.Error()}
	}
	if buf.Len() > limit {
		return nil, request.TooLarge(limit)
	}
	return buf.Bytes(), nil
}

func (h *handler) slo(r *http.Request) time.Duration {
	if h.opt.Config.SLOHeader == "" {
		return 0
	}
	ms, err := strconv.ParseFloat(r.Header.Get(h.opt.Config.SLOHeader), 64)
	if err != nil || ms <= 0 || ms >= 1e9 {
		return 0
	}
	return time.Duration(ms * float64(time.Millisecond))
}

// rewrite sends the request to the booked worker. The destination header is
// overwritten with the decision (never a client's value), as the ext_proc path does.
func (h *handler) rewrite(pr *httputil.ProxyRequest) {
	f := pr.In.Context().Value(flightKey{}).(*flight)
	pr.SetURL(&url.URL{Scheme: "http", Host: f.ticket.Address})
	pr.SetXForwarded()
	if d := h.opt.Config.DestinationHeader; d != "" {
		pr.Out.Header.Set(d, f.ticket.Address)
	}
	// The worker continues the trace from kvroute's route span (W3C traceparent).
	f.route.Inject(pr.Out.Header.Set)
}

func (h *handler) modifyResponse(resp *http.Response) error {
	f := resp.Request.Context().Value(flightKey{}).(*flight)
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || f.req.Stream
	resp.Body = &trackedBody{rc: resp.Body, f: f, h: h, status: resp.StatusCode, tr: response.NewTracker(sse, 0), ctx: resp.Request.Context()}
	if wh := h.opt.Config.WorkerHeader; wh != "" {
		resp.Header.Set(wh, f.ticket.Worker)
	}
	if ph := h.opt.Config.PredictedTTFTHeader; ph != "" && f.ticket.Predicted.TTFT > 0 {
		resp.Header.Set(ph, strconv.FormatFloat(math.Round(float64(f.ticket.Predicted.TTFT)/float64(time.Millisecond)), 'f', 0, 64))
	}
	return nil
}

// errorHandler runs when the worker could not be reached or the response could not be
// read before headers: the ticket is aborted; the client gets 502 unless it is gone.
//
// Passive health: when the connection itself failed (a dial error: refused, no route,
// connect timeout), the worker is marked unhealthy in the registry so that no later
// pick chooses it until the /metrics scraper's next successful scrape marks it healthy
// again (workers.Scraper sets healthy on every success). Nothing reached the worker, so
// the first such failure is retried once on a worker the router picks anew (ServeHTTP).
// Failures after the connection was made (reset before headers) are not retried: the
// worker may have started on the request.
func (h *handler) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	f, _ := r.Context().Value(flightKey{}).(*flight)
	if r.Context().Err() != nil {
		if f != nil {
			h.abort(f, "client_gone")
		}
		return
	}
	h.m.ProxyUpstreamErrors.Inc()
	worker, addr := "", ""
	if f != nil {
		h.abort(f, "upstream_error")
		worker, addr = f.ticket.Worker, f.ticket.Address
	}
	if f != nil && isDialError(err) {
		if !h.opt.NoPassiveHealth {
			h.opt.Router.Registry().SetHealthy(worker, false)
		}
		h.log.Warn("proxy: worker unreachable (marked unhealthy until its next successful scrape unless passive health is off)",
			"worker", worker, "address", addr, "retry", f.mayRetry, "err", err)
		if f.mayRetry {
			f.retry = true
			return
		}
	} else {
		h.log.Warn("proxy: upstream error", "worker", worker, "address", addr, "err", err)
	}
	h.writeError(w, fmt.Errorf("%w: %v", router.ErrUpstream, err))
}

// isDialError reports whether err is a failure to open the connection (net.Dialer via
// http.Transport: *net.OpError with Op "dial"), i.e. nothing of the request was sent.
func isDialError(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

func (h *handler) abort(f *flight, reason string) {
	if f.ended {
		return
	}
	f.ended = true
	f.ticket.Abort()
	h.m.Aborts.WithLabelValues(reason).Inc()
	f.route.Fail("aborted: " + reason)
}

// writeError answers a refusal through the one shared mapping (router.ErrorReply).
func (h *handler) writeError(w http.ResponseWriter, err error) {
	rep := router.ErrorReply(err)
	h.m.ImmediateResponses.WithLabelValues(strconv.Itoa(rep.Status)).Inc()
	for _, kv := range rep.Header {
		w.Header().Set(kv[0], kv[1])
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(rep.Body)))
	w.WriteHeader(rep.Status)
	_, _ = w.Write(rep.Body)
}

// trackedBody feeds the response body to the Tracker as the ReverseProxy copies it.
type trackedBody struct {
	rc     io.ReadCloser
	f      *flight
	h      *handler
	tr     *response.Tracker
	status int
	ctx    context.Context
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 && !b.f.ended && b.tr.Write(p[:n]) {
		b.f.ticket.FirstToken(time.Time{})
		b.f.route.Event("first_token", time.Time{})
	}
	switch {
	case err == io.EOF:
		if !b.f.ended {
			b.f.ended = true
			u := b.tr.Finish()
			b.f.ticket.Done(b.status, u, time.Time{})
			b.f.route.Completed(b.status, u)
		}
	case err != nil:
		reason := "upstream_error"
		if b.ctx.Err() != nil || errors.Is(err, context.Canceled) {
			reason = "client_gone"
		}
		b.h.abort(b.f, reason)
	}
	return n, err
}

// Close is called by the ReverseProxy when copying stops; a body not read to its end
// (client gone, write error) is an abort.
func (b *trackedBody) Close() error {
	err := b.rc.Close()
	b.h.abort(b.f, "client_gone")
	return err
}

// statusRecorder remembers the status for the metrics; Unwrap keeps Flush working
// through http.ResponseController (what ReverseProxy uses).
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func statusClass(code int) string {
	if code == 0 {
		return "error"
	}
	return strconv.Itoa(code/100) + "xx"
}
