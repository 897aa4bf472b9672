// Package proxy is `kvroute proxy`: a plain OpenAI-compatible reverse proxy over the
// same router core, for running without Envoy. It reads the body (bounded by
// extproc.max_body_bytes), parses it (package request), picks and books a worker
// (router.Pick), forwards the request there with net/http/httputil.ReverseProxy,
// streams the response back without buffering (SSE flushes every write), and watches
// the body with response.Tracker exactly as the ext_proc path does: first generated
// token → Ticket.FirstToken, end of body (EOF, or the SSE end marker [DONE] /
// message_stop, so a client that hangs up right after it was served) → Ticket.Complete
// with usage and outcome, client disconnect or upstream failure → Ticket.AbortWith.
// Each request is counted once on kvroute_proxy_requests_total{code,outcome}, before a
// ReverseProxy http.ErrAbortHandler panic is re-raised. A worker that refuses the connection is marked
// unhealthy (passive health) and the request retried once on another pick. Refusals use
// front.ErrorReply, the mapping the ext_proc server uses, so both fronts answer the
// same status and error JSON. A ticket with a remote prefill (prefill/decode
// disaggregation) is sent to its prefill worker first, then to its decode worker with
// the KV transfer parameters the prefill answered (pd.go); a client's own
// kv_transfer_params are removed.
//
// Hardening: only the inference API paths in Options.Proxy.Paths are
// forwarded (others 404, so worker-admin routes such as POST /reset_prefix_cache stay
// unreachable); a JSON API body with a non-JSON Content-Type is 415 (a missing one is
// taken as JSON, as vLLM's FastAPI does); the body buffer grows with the bytes that
// arrive, never from the declared Content-Length; reading the body has a deadline
// (Options.BodyTimeout, 408); an oversize body is answered 413 and then drained (to its
// end, under the body deadline) before the connection closes, so clients that do not send
// Expect: 100-continue read the 413 instead of a connection reset; every write to the
// client has a deadline (Options.WriteTimeout); a worker that sends no response headers
// within Proxy.UpstreamHeaderTimeout, or no body bytes for Proxy.UpstreamIdleTimeout,
// is cut: the ticket is aborted (reason upstream_timeout), the worker marked unhealthy
// (passive health) and the client answered 502 (or its stream reset).
package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/classify"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/front"
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
	// Proxy holds the upstream timeouts, the transport's pool size and the forwarded
	// paths; zero fields take config.Default().Proxy's values.
	Proxy config.Proxy
	// BodyTimeout bounds reading one request body (server.http_body_timeout); 0: none.
	BodyTimeout time.Duration
	// WriteTimeout bounds each write to the client (server.http_write_timeout); 0: none.
	WriteTimeout time.Duration
	// Admission is the admission stage (tenant identity, budgets); nil admits every
	// request as unattributed. A tenant header counts only from its trusted_peers.
	Admission *admission.Admitter
	// Classify is the classify stage (rules over what the request says); nil: off.
	Classify *classify.Rules
}

// drainTimeout bounds, when Options.BodyTimeout is 0, how long the rest of an oversize
// body is read and discarded after the 413 (nginx's lingering_time default, 30 s).
const drainTimeout = 30 * time.Second

type handler struct {
	opt Options
	m   *metrics.ExtProc
	log *slog.Logger
	rp  *httputil.ReverseProxy
	// paths forwarded (Options.Proxy.Paths, trailing "/" trimmed)
	paths map[string]bool
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
	def := config.Default().Proxy
	if opt.Proxy.UpstreamHeaderTimeout <= 0 {
		opt.Proxy.UpstreamHeaderTimeout = def.UpstreamHeaderTimeout
	}
	if opt.Proxy.UpstreamIdleTimeout <= 0 {
		opt.Proxy.UpstreamIdleTimeout = def.UpstreamIdleTimeout
	}
	if opt.Proxy.MaxIdleConnsPerHost <= 0 {
		opt.Proxy.MaxIdleConnsPerHost = def.MaxIdleConnsPerHost
	}
	if len(opt.Proxy.Paths) == 0 {
		opt.Proxy.Paths = def.Paths
	}
	if opt.Transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		// Keep-alive pool sized for the load: DefaultTransport keeps 2 idle
		// connections per worker (and 100 in all), so every concurrent request above
		// that opens and closes a socket (TIME_WAIT pile-up at a few hundred req/s).
		t.MaxIdleConns = 0 // no total cap: the per-worker cap bounds it
		t.MaxIdleConnsPerHost = opt.Proxy.MaxIdleConnsPerHost
		opt.Transport = t
	}
	h := &handler{opt: opt, m: opt.Metrics.ExtProc, log: opt.Logger, paths: map[string]bool{}}
	for _, p := range opt.Proxy.Paths {
		h.paths[p] = true // exact: /v1/chat/completions/ is another path (request.APIForPath)
	}
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
	front.Flight                  // the ticket's end: Complete or Abort, settlement, span
	grant        *admission.Grant // the Flight's Grant, typed: CountsTokens, Release
	tags         [][2]string      // upstream headers the classify stage set
	counter      *response.Tracker
	req          *request.Request
	mayRetry     bool // first attempt: a connect failure may be retried on another worker
	// stripUsage: kvroute asked for usage on the client's behalf (request.WithIncludeUsage),
	// so the usage-only chunk is removed from what the client sees
	stripUsage bool
	retry      bool   // set by errorHandler: nothing was written, pick again
	requestID  string // X-Request-Id of both legs of a remote prefill (pd.go); "" none

	// Upstream watchdog: armed with the header timeout when the attempt starts, re-armed
	// with the idle timeout by the response headers and every body read. When it fires,
	// timedOut is set and the attempt's context is cancelled, which fails the pending
	// RoundTrip or body Read.
	watchdog *time.Timer
	timedOut atomic.Bool
	cancel   context.CancelFunc
}

// arm (re)starts the watchdog for d.
func (f *flight) arm(d time.Duration) {
	if f.watchdog != nil {
		f.watchdog.Reset(d)
	}
}

type flightKey struct{}

// counted is the generated tokens counted from the stream for the settlement: none
// when no response arrived, -1 (estimate) when they were not counted.
func (f *flight) counted() int { return admission.Streamed(f.counter) }

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &statusRecorder{ResponseWriter: w}
	api := request.APIForPath(r.URL.Path)
	route := tracing.StartRoute(r.Context(), h.opt.Tracer, r.Header.Get, string(api))
	defer route.End()
	var f *flight
	gone := false // the client went away before anything was routed (mid-upload, while queued)
	defer func() {
		// Every request is counted, with its outcome, before a panic is re-raised:
		// ReverseProxy panics with http.ErrAbortHandler when copying the body fails
		// (the client hung up), and that request must not vanish from the counters.
		p := recover()
		reason := "client_gone"
		if p != nil && p != http.ErrAbortHandler {
			h.m.Panics.Inc()
			h.log.Error("proxy: panic", "panic", p, "stack", string(debug.Stack()))
			if rec.status == 0 {
				h.writeError(rec, api, fmt.Errorf("panic: %v", p))
			}
			reason = "panic"
		}
		o := response.OutcomeRejected // kvroute answered itself, nothing was routed
		if gone {
			o = response.OutcomeAborted
		}
		if f != nil {
			o = f.Abort(reason, response.OutcomeAborted, f.counted()) // the recorded outcome when it had ended
		}
		h.m.ProxyRequests.WithLabelValues(statusClass(rec.status), string(o)).Inc()
		if p == http.ErrAbortHandler {
			panic(p)
		}
	}()
	if h.opt.WriteTimeout > 0 {
		rec.rc, rec.writeTimeout = http.NewResponseController(w), h.opt.WriteTimeout
		defer func() { _ = rec.rc.SetWriteDeadline(time.Time{}) }() // the next request on this connection starts fresh
	}
	if !h.paths[r.URL.Path] {
		h.writeError(rec, api, &request.Error{Status: http.StatusNotFound, Type: "NotFoundError",
			Message: "kvroute proxy: this path is not forwarded (proxy.paths)"})
		return
	}
	if api != request.APIOther && !jsonContentType(r.Header.Get("Content-Type")) {
		h.writeError(rec, api, &request.Error{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error",
			Message: "Content-Type must be application/json"})
		return
	}
	// Authentication first, from the headers: a client without a valid identity gets
	// its 401 before its body is read or parsed.
	id, err := h.opt.Admission.Identify(admission.Input{Header: r.Header.Get, Peer: peerAddr(r)})
	if err != nil {
		route.Fail("request refused")
		h.writeError(rec, api, err)
		return
	}
	limit := h.opt.Config.MaxBodyBytes
	if r.ContentLength > int64(limit) {
		h.refuseOversize(rec, r, limit)
		return
	}
	ctx := route.Context(r.Context())
	_, span := tracing.Start(ctx, h.opt.Tracer, tracing.SpanParse)
	defer span.End() // ended at once after parsing; this covers the early returns
	body, err := h.readBodyWithDeadline(rec, r, limit)
	if err != nil {
		if qe, ok := request.AsError(err); ok && qe.Status == http.StatusRequestEntityTooLarge {
			h.refuseOversize(rec, r, limit)
			return
		}
		if clientGone(err) {
			// Nobody to answer: no reply (net/http would otherwise send an empty 200),
			// the connection is dropped, and the request is counted aborted.
			route.Fail("client gone")
			gone = true
			panic(http.ErrAbortHandler)
		}
		h.writeError(rec, api, err)
		return
	}
	req, err := request.ParseBounded(api, body, h.opt.Router.MaxPromptIDs())
	span.End()
	if err != nil {
		route.Fail("request refused")
		h.writeError(rec, api, err)
		return
	}
	route.Set(tracing.Model(req.Model))
	body = h.withoutClientKVParams(body, req.API) // P/D is kvroute's to arrange (pd.go)
	var stripUsage bool
	if h.opt.Proxy.InjectIncludeUsage {
		body, stripUsage = request.WithIncludeUsage(body, req)
	}
	cd, body, err := h.classify(route, r, id.Tenant, req, body) // classify.go
	if err != nil {
		route.Fail("request refused")
		h.writeError(rec, api, err)
		return
	}
	po := router.PickOptions{RequestID: r.Header.Get("X-Request-Id"), SLO: h.slo(r)}
	if len(cd.Workers) > 0 {
		po.Subset, po.SubsetHint = cd.Workers, true
	}
	// At most two attempts: a worker that refuses the connection is marked unhealthy
	// (unless passive health is off) and the request, of which nothing was sent, is
	// picked again among the other workers (see errorHandler).
	for attempt := 0; attempt < 2; attempt++ {
		// Admission classifies the request and, for a class with a queue, holds it
		// here until a worker is predicted to meet the class objective (late binding).
		// The tenant's budget is reserved in the request's turn (Admit): a refusal
		// aborts the ticket and charges no fairness (VTC); an attempt whose connection
		// is refused releases its grant, which gives back the budget and the VTC prompt
		// charge, so a retried request costs its tenant once.
		pk, g, err := h.opt.Admission.Admit(ctx, h.opt.Router, req, po, id, admission.ClassInput{Tenant: id.Tenant, Header: r.Header.Get, Class: cd.Class})
		if err != nil {
			route.Fail("no pick")
			if r.Context().Err() != nil {
				// The client went away while queued: its entry is gone, nothing to answer.
				gone = true
				panic(http.ErrAbortHandler)
			}
			h.writeError(rec, api, err)
			return
		}
		t := pk.Ticket
		route.Set(t.TraceAttributes()...)
		f = &flight{Flight: front.Flight{Ticket: t, Grant: g, Route: route, Aborts: h.m.Aborts}, grant: g, req: req, mayRetry: attempt == 0,
			tags: cd.Header, stripUsage: stripUsage}
		send := body
		if t.RemotePrefill() { // prefill/decode disaggregation: the prefill leg first (pd.go)
			f.requestID = pdRequestID(r)
			if send, err = h.remotePrefill(ctx, r, f, body); err != nil && r.Context().Err() != nil {
				return // the client went away during the prefill leg: the deferred abort ends the ticket
			}
		}
		h.attempt(rec, r, f, send)
		if !f.retry {
			return
		}
		po.Exclude = t.Worker // never retry on the worker that refused the connection
	}
}

// peerAddr is the TCP peer of r (never a forwarded-for header).
func peerAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr()
}

// attempt forwards the request to f's worker once, under the upstream watchdog.
func (h *handler) attempt(rec *statusRecorder, r *http.Request, f *flight, body []byte) {
	ctx, cancel := context.WithCancel(context.WithValue(r.Context(), flightKey{}, f))
	f.cancel = cancel
	f.watchdog = time.AfterFunc(h.opt.Proxy.UpstreamHeaderTimeout, func() { f.timedOut.Store(true); cancel() })
	defer func() { f.watchdog.Stop(); cancel() }() // also when the ReverseProxy panics with ErrAbortHandler
	out := r.WithContext(ctx)
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.ContentLength = int64(len(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	h.rp.ServeHTTP(rec, out)
}

// jsonContentType accepts application/json with any parameters (charset=utf-8), and
// a missing Content-Type, which vLLM's FastAPI also reads as JSON.
func jsonContentType(ct string) bool {
	if ct == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}

// readBodyWithDeadline reads the body under the connection read deadline
// Options.BodyTimeout (a trickled body is a 408), then clears the deadline: the
// server's background read, which detects a client that goes away during a long
// response, must not hit it.
func (h *handler) readBodyWithDeadline(w http.ResponseWriter, r *http.Request, limit int) ([]byte, error) {
	rc := http.NewResponseController(w)
	deadline := h.opt.BodyTimeout > 0 && rc.SetReadDeadline(time.Now().Add(h.opt.BodyTimeout)) == nil
	body, err := readBody(r, limit)
	if err == nil && deadline {
		_ = rc.SetReadDeadline(time.Time{})
	}
	// On failure the deadline stays: net/http's post-handler drain of the unread body
	// must not block on a client that stopped sending.
	var ne net.Error
	if err != nil && errors.As(err, &ne) && ne.Timeout() {
		w.Header().Set("Connection", "close")
		return nil, &request.Error{Status: http.StatusRequestTimeout, Type: "invalid_request_error",
			Message: fmt.Sprintf("request body not received within %s (server.http_body_timeout)", h.opt.BodyTimeout)}
	}
	return body, err
}

// refuseOversize answers 413 and closes the connection. The reply goes out first; then
// the rest of the body the client is still sending is read and discarded to its end,
// however long (bounded in time by the body deadline, not in bytes: a byte bound only
// moves the reset to bodies past it), so that closing the socket does not send a TCP
// reset that would destroy the 413 before a client without Expect: 100-continue reads
// it (net/http closes, unread data pending, after a large unread body). This is
// nginx's lingering close. Nothing read is kept: memory stays at one copy buffer.
func (h *handler) refuseOversize(w http.ResponseWriter, r *http.Request, limit int) {
	rc := http.NewResponseController(w)
	_ = rc.EnableFullDuplex() // HTTP/1: keep reading the body after the reply started
	w.Header().Set("Connection", "close")
	h.writeError(w, request.APIForPath(r.URL.Path), request.TooLarge(limit))
	if rc.Flush() != nil {
		return
	}
	linger := h.opt.BodyTimeout
	if linger <= 0 {
		linger = drainTimeout
	}
	_ = rc.SetReadDeadline(time.Now().Add(linger))
	_, _ = io.Copy(io.Discard, r.Body)
}

// bodyError wraps a body read failure; it keeps the cause for errors.As (timeouts).
type bodyError struct {
	reply *request.Error
	cause error
}

func (e *bodyError) Error() string   { return e.reply.Error() }
func (e *bodyError) Unwrap() []error { return []error{e.reply, e.cause} }

// maxBodyPrealloc caps the buffer reserved before any body byte arrived (bytes): the
// buffer grows with the bytes actually received, so a declared Content-Length (up to
// max_body_bytes) costs nothing until the body comes.
const maxBodyPrealloc = 32 << 10

// readBody reads at most limit bytes; a longer body is a 413 (request.TooLarge).
func readBody(r *http.Request, limit int) ([]byte, error) {
	if r.ContentLength > int64(limit) {
		return nil, request.TooLarge(limit)
	}
	n := maxBodyPrealloc
	if r.ContentLength >= 0 && r.ContentLength < int64(n) {
		n = int(r.ContentLength)
	}
	buf := bytes.NewBuffer(make([]byte, 0, n+1))
	if _, err := buf.ReadFrom(io.LimitReader(r.Body, int64(limit)+1)); err != nil {
		return nil, &bodyError{reply: &request.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Message: "reading the request body: " + err.Error()}, cause: err}
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
	pr.SetURL(&url.URL{Scheme: "http", Host: f.Ticket.Address})
	pr.SetXForwarded()
	if d := h.opt.Config.DestinationHeader; d != "" {
		pr.Out.Header.Set(d, f.Ticket.Address)
	}
	if f.requestID != "" {
		pr.Out.Header.Set("X-Request-Id", f.requestID) // the prefill leg's
	}
	// The tenant header is kvroute's input (trusted only from trusted_peers), never
	// forwarded: a client's forged copy must not reach anything behind the worker.
	if th := h.opt.Admission.TenantHeader(); th != "" {
		pr.Out.Header.Del(th)
	}
	// With the classify stage on, its tag header is kvroute's word, never a client's.
	if h.opt.Classify != nil {
		pr.Out.Header.Del(classify.TagHeader)
		for _, kv := range f.tags {
			pr.Out.Header.Set(kv[0], kv[1])
		}
	}
	// The worker continues the trace from kvroute's route span (W3C traceparent).
	f.Route.Inject(pr.Out.Header.Set)
}

func (h *handler) modifyResponse(resp *http.Response) error {
	f := resp.Request.Context().Value(flightKey{}).(*flight)
	f.arm(h.opt.Proxy.UpstreamIdleTimeout) // headers arrived: from now on, silence is bounded
	sse := response.StreamBody(resp.Header.Get("Content-Type"), f.req.Stream)
	tr := response.NewTracker(sse, 0)
	if sse && f.grant.CountsTokens() {
		tr.CountContent() // settlement without usage (not asked for, or cut) counts what streamed
	}
	f.counter = tr
	resp.Body = &trackedBody{rc: resp.Body, f: f, h: h, status: resp.StatusCode, tr: tr, ctx: resp.Request.Context(),
		inference: f.req.API != request.APIOther}
	if f.stripUsage && sse {
		// The tracker reads the usage chunk; the client gets the stream without it.
		resp.Body = strippedBody{response.NewUsageStripper(resp.Body), resp.Body}
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
	}
	if wh := h.opt.Config.WorkerHeader; wh != "" {
		resp.Header.Set(wh, f.Ticket.Worker)
	}
	if ph := h.opt.Config.PredictedTTFTHeader; ph != "" && f.Ticket.Predicted.TTFT > 0 {
		resp.Header.Set(ph, strconv.FormatFloat(math.Round(float64(f.Ticket.Predicted.TTFT)/float64(time.Millisecond)), 'f', 0, 64))
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
	if f != nil && f.timedOut.Load() {
		h.upstreamTimeout(f, "response headers", h.opt.Proxy.UpstreamHeaderTimeout)
		h.writeError(w, f.req.API, fmt.Errorf("%w: no response headers within %s", front.ErrUpstream, h.opt.Proxy.UpstreamHeaderTimeout))
		return
	}
	if r.Context().Err() != nil {
		if f != nil {
			h.abort(f, "client_gone", response.OutcomeAborted)
		}
		return
	}
	h.m.ProxyUpstreamErrors.Inc()
	worker, addr := "", ""
	if f != nil {
		if isDialError(err) {
			f.grant.Release() // nothing reached the worker: it costs nothing
		}
		h.abort(f, "upstream_error", response.OutcomeUpstreamError)
		worker, addr = f.Ticket.Worker, f.Ticket.Address
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
	h.writeError(w, request.APIForPath(r.URL.Path), fmt.Errorf("%w: %v", front.ErrUpstream, err))
}

// isDialError reports whether err is a failure to open the connection (net.Dialer via
// http.Transport: *net.OpError with Op "dial"), i.e. nothing of the request was sent.
func isDialError(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// upstreamTimeout ends a ticket whose worker went silent (proxy.upstream_header_timeout
// or proxy.upstream_idle_timeout): an upstream error, and the worker is marked
// unhealthy through the passive-health path (unless passive health is off) until its
// next successful /metrics scrape.
func (h *handler) upstreamTimeout(f *flight, what string, d time.Duration) {
	if f.Ended() {
		return
	}
	h.m.ProxyUpstreamErrors.Inc()
	h.abort(f, "upstream_timeout", response.OutcomeUpstreamError)
	if !h.opt.NoPassiveHealth {
		h.opt.Router.Registry().SetHealthy(f.Ticket.Worker, false)
	}
	h.log.Warn("proxy: worker silent, request cut (marked unhealthy until its next successful scrape unless passive health is off)",
		"worker", f.Ticket.Worker, "address", f.Ticket.Address, "waiting_for", what, "timeout", d)
}

// abort ends f's ticket with outcome o, counting reason on kvroute_extproc_aborts_total.
func (h *handler) abort(f *flight, reason string, o response.Outcome) {
	f.Abort(reason, o, f.counted())
}

// writeError answers a refusal through the one shared mapping (front.ErrorReply).
func (h *handler) writeError(w http.ResponseWriter, api request.API, err error) {
	rep := front.ErrorReply(api, err)
	h.m.ImmediateResponses.WithLabelValues(strconv.Itoa(rep.Status)).Inc()
	for _, kv := range rep.Header {
		w.Header().Set(kv[0], kv[1])
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(rep.Body)))
	w.WriteHeader(rep.Status)
	_, _ = w.Write(rep.Body)
}
