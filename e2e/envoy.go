// Package e2e holds kvroute's end-to-end tests and the Envoy stand-in they run
// against. No Envoy binary can be installed where the tests run, so Envoy (the
// HTTP connection manager, the ext_proc filter, the router filter and an ORIGINAL_DST
// cluster with use_http_header) is imitated here in Go. Every imitated behaviour
// cites the Envoy source or doc it follows, with the citation keys of
// Envoy's ext_proc filter source (CC ext_proc.cc, PS processor_state.cc, MU
// mutation_utils.cc, MR mutation_rules, GC grpc_client_impl.h, OD original_dst
// cluster, RT router.cc, CMU conn_manager_utility.cc, PM/EP/SVC the protos).
//
// Deliberate simplifications (each keeps the message sequence Envoy produces):
//   - the request direction finishes before the response direction starts (Envoy may
//     interleave them when the upstream answers early; our workers read the whole body
//     first);
//   - response bodies are not pipelined (one chunk in flight), request STREAMED bodies are;
//   - a response BUFFERED_PARTIAL body is processed like STREAMED;
//   - request header mode SKIP sends no request-direction message at all;
//   - no mode_override, no send_body_without_waiting_for_header_response, no
//     observability mode; retries only with OverrideHost (connect failures down
//     kvroute's endpoint list).
package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Mode is an ext_proc body send mode (PM).
type Mode = procmodev3.ProcessingMode_BodySendMode

// The body modes.
const (
	None            = procmodev3.ProcessingMode_NONE
	Streamed        = procmodev3.ProcessingMode_STREAMED
	Buffered        = procmodev3.ProcessingMode_BUFFERED
	BufferedPartial = procmodev3.ProcessingMode_BUFFERED_PARTIAL
	FullDuplex      = procmodev3.ProcessingMode_FULL_DUPLEX_STREAMED
)

// Config is the slice of an Envoy configuration the stand-in imitates.
type Config struct {
	ExtProcAddr string // kvroute's ext_proc gRPC address (grpc_service)

	// processing_mode (PM). Header modes default to SEND, trailer modes to SKIP.
	SkipRequestHeaders  bool
	SkipResponseHeaders bool
	RequestBodyMode     Mode
	ResponseBodyMode    Mode
	RequestTrailers     bool // request_trailer_mode SEND (required with FULL_DUPLEX_STREAMED: CFG)
	ResponseTrailers    bool // response_trailer_mode SEND

	NoProtocolConfig bool          // imitate an Envoy that predates protocol_config
	MessageTimeout   time.Duration // message_timeout; 0 → 200 ms (EP)
	FailureModeAllow bool          // failure_mode_allow (EP)
	GracefulClose    bool          // runtime ext_proc_graceful_grpc_close (RF; default false)

	// BufferLimit is the connection/route buffer limit, bytes; 0 → 1 MiB
	// (per_connection_buffer_limit_bytes default).
	BufferLimit int
	// ChunkSize is how the imitated codec slices request bodies, bytes; 0 → 16 KiB.
	ChunkSize int

	// DestinationHeader is the ORIGINAL_DST cluster's http_header_name; "" →
	// x-gateway-destination-endpoint.
	DestinationHeader string
	// MetadataKey makes the cluster read envoy.lb/<DestinationHeader> dynamic metadata
	// first (OD metadata_key, which takes precedence over the header).
	MetadataKey bool
	// ReceivingNamespaces are metadata_options.receiving_namespaces.untyped; nil → [envoy.lb].
	ReceivingNamespaces []string
	// ForwardingNamespaces are metadata_options.forwarding_namespaces.untyped: the
	// stream's dynamic metadata of these namespaces rides on every ProcessingRequest as
	// metadata_context (CC addDynamicMetadata). nil → none.
	ForwardingNamespaces []string
	// RequestMetadata is dynamic metadata an earlier filter set on every request
	// ({namespace: {key: value}}), e.g. the GIE subset hint envoy.lb.subset_hint.
	RequestMetadata map[string]map[string]any
	// OverrideHost imitates the override_host load balancing policy (OH) on a cluster
	// of the workers instead of ORIGINAL_DST: endpoints "ip:port,ip:port,..." from the
	// destination header (first value), else envoy.lb metadata; attempt N goes to the
	// N-th endpoint, a connect failure is retried up to Retries times (route
	// retry_policy retry_on connect-failure); the endpoint that served is written to
	// envoy.lb/<DestinationHeader>-served (selected_host_key).
	OverrideHost bool
	Retries      int

	// StripHeaders are removed from the client's request before anything else (HCM
	// early_header_mutation_extensions with header_mutation remove: they run before
	// route selection and before any filter).
	StripHeaders []string
	// FallbackWorkers, when set, imitates the shipped route table: a first route
	// matching only when DestinationHeader is present (present_match) goes to the
	// ORIGINAL_DST cluster, and a catch-all route goes to a round-robin cluster of these
	// worker addresses. Envoy selects the route on the request as it arrives (after
	// StripHeaders) and selects it again only after a request-direction reply that
	// carries a header mutation and clear_route_cache, or any such reply when
	// RouteCacheClear is set (PS DecodingProcessorState::clearRouteCache; reference
	// §5.2). nil: every request goes to ORIGINAL_DST (the earlier bootstraps).
	FallbackWorkers []string
	// RouteCacheClear is ext_proc's route_cache_action: CLEAR.
	RouteCacheClear bool
	// JWT, when set, is a jwt_authn filter before ext_proc (after StripHeaders): it
	// answers 401 itself or writes the verified payload to dynamic metadata
	// (JWTNamespace), which ForwardingNamespaces must list for kvroute to see it.
	JWT *JWTAuthn
}

// Stats are counters of what the stand-in did, for assertions.
type Stats struct {
	Messages          int64 // ProcessingRequests sent
	Timeouts          int64 // per-message timeouts
	Fallbacks         int64 // requests routed by the catch-all route to FallbackWorkers
	RejectedMutations int64 // header mutations silently dropped by the default rules (MR)
	NoHealthyUpstream int64 // 503s from the router: no/invalid destination (OD, RT)
	LocalReplies      int64 // local replies (immediate responses and Envoy's own errors)
	DownstreamResets  int64 // clients that hung up mid-body: stream reset, ext_proc stream closed
}

type stats struct {
	messages, timeouts, rejected, noHost, local, fallbacks, resets atomic.Int64
}

// Envoy is the stand-in: an http.Handler playing the downstream listener.
type Envoy struct {
	cfg      Config
	conn     *grpc.ClientConn
	client   extprocv3.ExternalProcessorClient
	upstream *http.Client
	stats    stats
	seq      atomic.Uint64
	rr       atomic.Uint64 // fallback cluster round robin
}

// New connects to the processor and returns the stand-in.
func New(cfg Config) (*Envoy, error) {
	if cfg.MessageTimeout <= 0 {
		cfg.MessageTimeout = 200 * time.Millisecond
	}
	if cfg.BufferLimit <= 0 {
		cfg.BufferLimit = 1 << 20
	}
	if cfg.ChunkSize <= 0 {
		cfg.ChunkSize = 16 << 10
	}
	if cfg.DestinationHeader == "" {
		cfg.DestinationHeader = "x-gateway-destination-endpoint"
	}
	if cfg.ReceivingNamespaces == nil {
		cfg.ReceivingNamespaces = []string{"envoy.lb"}
	}
	if cfg.RequestBodyMode == FullDuplex && !cfg.RequestTrailers {
		return nil, fmt.Errorf("FULL_DUPLEX_STREAMED requires request_trailer_mode SEND (CFG verifyProcessingModeConfig)")
	}
	if cfg.ResponseBodyMode == FullDuplex && !cfg.ResponseTrailers {
		return nil, fmt.Errorf("FULL_DUPLEX_STREAMED requires response_trailer_mode SEND (CFG verifyProcessingModeConfig)")
	}
	conn, err := grpc.NewClient(cfg.ExtProcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableCompression = true
	return &Envoy{cfg: cfg, conn: conn, client: extprocv3.NewExternalProcessorClient(conn),
		upstream: &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}, nil
}

// Close releases the gRPC connection.
func (e *Envoy) Close() error {
	e.upstream.CloseIdleConnections()
	return e.conn.Close()
}

// Stats returns the counters so far.
func (e *Envoy) Stats() Stats {
	return Stats{Messages: e.stats.messages.Load(), Timeouts: e.stats.timeouts.Load(), RejectedMutations: e.stats.rejected.Load(),
		NoHealthyUpstream: e.stats.noHost.Load(), LocalReplies: e.stats.local.Load(), Fallbacks: e.stats.fallbacks.Load(),
		DownstreamResets: e.stats.resets.Load()}
}

// ServeHTTP handles one downstream request: the ext_proc request phases, the router
// (ORIGINAL_DST host selection), the upstream call, the response phases.
func (e *Envoy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	x := &exchange{e: e, w: w, r: r, side: e.newSideStream(r.Context())}
	x.hdrs = requestHeaders(r, fmt.Sprintf("envoy-%d", e.seq.Add(1)))
	for _, k := range e.cfg.StripHeaders {
		x.hdrs = x.hdrs.del(strings.ToLower(k)) // early header mutation: before routing and filters
	}
	x.routeHdrs = x.hdrs // the route is selected on the request as it arrived
	x.hasBody = r.Body != nil && r.Body != http.NoBody
	defer x.side.close()
	if j := e.cfg.JWT; j != nil { // http filter chain order: jwt_authn, then ext_proc
		payload, lr := j.verify(x.hdrs)
		if lr != nil {
			x.localReply(lr)
			return
		}
		if payload != nil {
			if j.PayloadInMetadata != "" {
				x.side.setMeta(JWTNamespace, j.PayloadInMetadata, payload)
			}
			if !j.Forward {
				x.hdrs = x.hdrs.del("authorization")
			}
		}
	}
	up, lr := x.requestPath()
	if up == nil && lr == nil {
		lr = &localReply{status: 500, body: "stand-in: no request to forward"}
	}
	if lr != nil {
		x.localReply(lr)
		return
	}
	resp, lr := x.forward(up)
	x.reqWG.Wait()
	if br := x.bodyFailure(); br != nil && (lr == nil || br.reset) {
		lr = br // a client gone mid-body fails the upstream call too: the reset is the cause
	}
	if lr != nil {
		if resp != nil {
			resp.Body.Close()
		}
		x.localReply(lr)
		return
	}
	defer resp.Body.Close()
	x.responsePath(resp)
}

// destination is ORIGINAL_DST's chooseHost with use_http_header (OD): metadata_key
// first when configured, then the header's FIRST value; only a literal IP:port
// parses (parseInternetAddressAndPortNoThrow): hostnames and comma lists are invalid.
func (x *exchange) destination(h headerList) (string, bool) {
	if x.e.cfg.MetadataKey {
		if v, ok := x.side.meta("envoy.lb", x.e.cfg.DestinationHeader); ok {
			if ap, err := netip.ParseAddrPort(v); err == nil {
				return ap.String(), true
			}
		}
	}
	v := h.get(x.e.cfg.DestinationHeader)
	ap, err := netip.ParseAddrPort(strings.TrimSpace(v))
	if err != nil {
		return "", false
	}
	return ap.String(), true
}

// forward is the router filter: host selection, then the upstream request. Missing or
// malformed destination → local reply 503 "no healthy upstream" (RT
// sendNoHealthyUpstreamResponse, flag UH); connect failure → 503 (flag UF).
func (x *exchange) forward(up *upReq) (*http.Response, *localReply) {
	x.forwarded = true
	var addr string
	ok := false
	if fb := x.e.cfg.FallbackWorkers; len(fb) > 0 {
		on := x.routeHdrs // the cached route, unless kvroute's reply cleared it
		if x.routeCleared {
			on = up.headers
		}
		if !on.has(x.e.cfg.DestinationHeader) {
			x.e.stats.fallbacks.Add(1)
			addr, ok = fb[int(x.e.rr.Add(1)-1)%len(fb)], true
		}
	}
	if x.e.cfg.OverrideHost {
		return x.forwardOverrideHost(up)
	}
	if !ok {
		addr, ok = x.destination(up.headers)
	}
	if !ok {
		x.e.stats.noHost.Add(1)
		return nil, &localReply{status: 503, body: "no healthy upstream", details: "no_healthy_upstream"}
	}
	return x.send(up, addr)
}

// forwardOverrideHost is the router with the override_host policy (OH): kvroute's
// endpoint list in order, one per attempt, retried on connect failure; the served
// endpoint goes to dynamic metadata (selected_host_key).
func (x *exchange) forwardOverrideHost(up *upReq) (*http.Response, *localReply) {
	v := up.headers.get(x.e.cfg.DestinationHeader)
	if v == "" {
		v, _ = x.side.meta("envoy.lb", x.e.cfg.DestinationHeader)
	}
	var eps []string
	for _, e := range strings.Split(v, ",") {
		if ap, err := netip.ParseAddrPort(strings.TrimSpace(e)); err == nil {
			eps = append(eps, ap.String())
		}
	}
	if len(eps) == 0 {
		x.e.stats.noHost.Add(1) // the stand-in has no fallback policy's endpoints
		return nil, &localReply{status: 503, body: "no healthy upstream", details: "no_healthy_upstream"}
	}
	var lr *localReply
	for attempt := 0; attempt <= x.e.cfg.Retries && attempt < len(eps); attempt++ {
		var resp *http.Response
		if resp, lr = x.send(up, eps[attempt]); lr == nil {
			x.side.setMeta("envoy.lb", x.e.cfg.DestinationHeader+"-served", eps[attempt])
			return resp, nil
		}
	}
	return nil, lr
}

// send is one upstream attempt to addr.
func (x *exchange) send(up *upReq, addr string) (*http.Response, *localReply) {
	req, err := http.NewRequestWithContext(x.r.Context(), up.headers.get(":method"), "http://"+addr+up.headers.get(":path"), up.body)
	if err != nil {
		return nil, &localReply{status: 500, body: err.Error()}
	}
	for _, kv := range up.headers {
		if strings.HasPrefix(kv[0], ":") || kv[0] == "content-length" {
			continue
		}
		req.Header.Add(kv[0], kv[1])
	}
	req.Host = up.headers.get(":authority")
	req.ContentLength = up.length
	if up.length == 0 && x.hasBody && up.body != nil {
		req.ContentLength = -1
	}
	resp, err := x.e.upstream.Do(req)
	if err != nil {
		return nil, &localReply{status: 503, body: "upstream connect error or disconnect/reset before headers", details: "upstream_reset_before_response_started"}
	}
	return resp, nil
}

// localReply is a response Envoy generates itself. Since the CVE-2025-30157 fix it
// is not sent through the response phases to the processor (§2.1).
type localReply struct {
	status  int
	body    string
	headers headerList
	details string
	reset   bool // the client reset mid-body (downstreamReset): nothing is sent
}

func (x *exchange) localReply(lr *localReply) {
	if br := x.bodyFailure(); br != nil && br.reset {
		lr = br // the side stream's failure that followed the reset is not answered
	}
	if lr.reset {
		panic(http.ErrAbortHandler) // the connection is gone: no response
	}
	x.e.stats.local.Add(1)
	if x.wroteHeaders {
		// The response already started downstream: Envoy can only reset the stream (SVC).
		panic(http.ErrAbortHandler)
	}
	h := x.w.Header()
	h.Set("Content-Type", "text/plain")
	for _, kv := range lr.headers {
		h.Set(kv[0], kv[1])
	}
	h.Set("Content-Length", fmt.Sprint(len(lr.body)))
	if lr.details != "" {
		h.Set("X-Response-Code-Details", lr.details) // %RESPONSE_CODE_DETAILS%, exposed for tests
	}
	x.w.WriteHeader(lr.status)
	_, _ = x.w.Write([]byte(lr.body))
}

// failure turns a side-stream error into Envoy's answer (reference §3.7, §5.5):
// per-message timeout 504, gRPC error or spurious reply status_on_error 500; with
// failure_mode_allow the request continues unmodified (nil). A clean close (OK) always
// continues (CC onGrpcClose).
func (x *exchange) failure(err error) *localReply {
	if err == errClosedOK {
		return nil
	}
	if errors.Is(err, errMutation) {
		// Invalid mutations are 500 even with failure_mode_allow (§3.7).
		x.side.setDone()
		return &localReply{status: 500, body: "ext_proc error", details: strings.ReplaceAll(err.Error(), " ", "_")}
	}
	if x.e.cfg.FailureModeAllow && !x.duplexStarted {
		x.side.setDone()
		return nil
	}
	x.side.setDone()
	if err == errTimeout {
		return &localReply{status: 504, body: "ext_proc message timeout", details: errTimeout.Error()}
	}
	if ctxErr := x.r.Context().Err(); ctxErr != nil {
		return &localReply{status: 499, body: "client gone"}
	}
	return &localReply{status: 500, body: "ext_proc error", details: strings.ReplaceAll(err.Error(), " ", "_")}
}

// immediate converts an ImmediateResponse (SVC; CC sendImmediateResponse): status
// below 200 → 200; headers applied with the mutation rules; body as given; content-type
// text/plain unless the processor set one. Processing stops.
func (x *exchange) immediate(ir *extprocv3.ImmediateResponse) *localReply {
	x.side.setDone()
	st := int(ir.GetStatus().GetCode())
	if st < 200 {
		st = 200
	}
	var rejected int
	h, err := headerList{}.apply(ir.GetHeaders(), false, &rejected)
	if err != nil {
		h = nil // errors are only logged for immediate responses (SVC)
	}
	x.e.stats.rejected.Add(int64(rejected))
	return &localReply{status: st, body: string(ir.GetBody()), headers: h, details: strings.ReplaceAll(ir.GetDetails(), " ", "_")}
}

// expect awaits the reply to a message of phase want. An ImmediateResponse is
// accepted in every phase; any other kind is spurious → 500 (PS; §3.1). A nil reply
// with a nil localReply means the processor closed cleanly: continue unmodified.
func (x *exchange) expect(want string, timeout time.Duration) (*extprocv3.CommonResponse, *localReply, bool) {
	r, err := x.side.await(timeout)
	if err != nil {
		return nil, x.failure(err), false
	}
	if ir := r.GetImmediateResponse(); ir != nil {
		return nil, x.immediate(ir), false
	}
	var cr *extprocv3.CommonResponse
	ok := false
	switch want {
	case "request_headers":
		ok, cr = r.GetRequestHeaders() != nil, r.GetRequestHeaders().GetResponse()
	case "request_body":
		ok, cr = r.GetRequestBody() != nil, r.GetRequestBody().GetResponse()
	case "request_trailers":
		ok = r.GetRequestTrailers() != nil
	case "response_headers":
		ok, cr = r.GetResponseHeaders() != nil, r.GetResponseHeaders().GetResponse()
	case "response_body":
		ok, cr = r.GetResponseBody() != nil, r.GetResponseBody().GetResponse()
	case "response_trailers":
		ok = r.GetResponseTrailers() != nil
	}
	if !ok {
		return nil, x.failure(fmt.Errorf("%w: got %T while waiting for %s", errSpurious, r.GetResponse(), want)), false
	}
	return cr, nil, true
}
