package extproc

import (
	"context"
	"net/netip"
	"strconv"
	"strings"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/front"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tracing"
)

// phase names a ProcessingRequest kind (metrics label, logs).
type phase string

const (
	phaseNone        phase = "none"
	phaseReqHeaders  phase = "request_headers"
	phaseReqBody     phase = "request_body"
	phaseReqTrailers phase = "request_trailers"
	phaseRspHeaders  phase = "response_headers"
	phaseRspBody     phase = "response_body"
	phaseRspTrailers phase = "response_trailers"
)

// maxStreamedChunk bounds one streamed_response body (PM recommends ≤ 64 KiB, below
// Envoy's gRPC max_receive_message_length).
const maxStreamedChunk = 64 << 10

// stream is the state of one ext_proc stream (one HTTP request). It is owned by the
// goroutine running Server.Process; nothing else touches it.
type stream struct {
	s    *Server
	ctx  context.Context
	send func(*extprocv3.ProcessingResponse) error

	phase   phase // of the message being handled
	replied bool  // the message being handled got a reply (for the overhead histogram)
	first   bool  // no message handled yet (protocol_config comes on the first only)

	reqMode, respMode mode
	withoutWaiting    bool       // send_body_without_waiting_for_header_response (STREAMED only)
	observability     bool       // observability_mode: replies are ignored, nothing is held
	client            netip.Addr // Envoy's source.address attribute (clientAddr); zero when not sent

	// request direction
	sawHeaders    bool
	api           request.API
	requestID     string
	slo           time.Duration
	subset        []string // GIE endpoint subset hint (when hasSubset)
	hasSubset     bool
	servedSeen    bool // the served endpoint was read from the response metadata
	contentLength int  // -1 unknown
	awaitingBody  bool // the pick waits for body (headers held by Envoy or by us)
	holdHeaders   bool // we withhold the headers reply (FULL_DUPLEX_STREAMED, STREAMED without waiting)
	heldChunks    int  // STREAMED body messages received while the headers reply is withheld
	body          []byte
	reqEOSSent    bool // FULL_DUPLEX: a streamed_response with end_of_stream went out
	failed        bool // an ImmediateResponse went out: Envoy stops processing and closes
	req           *request.Request
	ticket        *router.Ticket
	tenant        admission.Identity   // from the request headers message (Identify)
	classIn       admission.ClassInput // headers and metadata for the QoS class (admission.Pick)
	path          string               // :path without its query (the classify stage's input)
	tags          [][2]string          // upstream headers the classify stage set
	grant         *admission.Grant     // settled with the ticket (complete, finish)
	route         *tracing.Route       // the kvroute.route span; nil until the request headers
	traceparent   string               // W3C trace context of the caller (request headers)
	tracestate    string

	// response direction
	status      int
	tracker     *response.Tracker
	flight      *front.Flight // the ticket's end (complete or abort, settlement); set with ticket
	rspEOSSent  bool
	counted     bool                 // the request was counted on Requests (record)
	stripUsage  bool                 // include_usage was injected for the client (usage.go)
	bodyMutated bool                 // the request body sent upstream differs from the client's (usage.go)
	stripping   bool                 // stripUsage, and the response is SSE: its body goes through usage
	usage       response.UsageFilter // removes the usage-only chunk the injection added
}

func newStream(s *Server, ctx context.Context, send func(*extprocv3.ProcessingResponse) error) *stream {
	return &stream{s: s, ctx: ctx, send: send, phase: phaseNone, first: true,
		reqMode: s.reqMode, respMode: s.respMode, contentLength: -1}
}

// handle dispatches one ProcessingRequest: the single type switch over the oneof.
func (st *stream) handle(req *extprocv3.ProcessingRequest) error {
	st.replied = false
	if st.first {
		st.first = false
		// protocol_config comes only on the first message of a stream (CC encodeProtocolConfig).
		if pc := req.GetProtocolConfig(); pc != nil {
			st.reqMode, st.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
			st.withoutWaiting = pc.GetSendBodyWithoutWaitingForHeaderResponse() && st.reqMode == modeStreamed
		}
	}
	st.observability = st.observability || req.GetObservabilityMode()
	switch v := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		st.phase = phaseReqHeaders
		st.count()
		st.readSubsetHint(req.GetMetadataContext())
		st.client = clientAddr(req)
		return st.requestHeaders(v.RequestHeaders, req.GetMetadataContext().GetFilterMetadata())
	case *extprocv3.ProcessingRequest_RequestBody:
		st.phase = phaseReqBody
		st.count()
		st.s.m.BodyBytes.WithLabelValues("request").Add(float64(len(v.RequestBody.GetBody())))
		return st.requestBody(v.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		st.phase = phaseReqTrailers
		st.count()
		return st.requestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		st.phase = phaseRspHeaders
		st.count()
		st.readServed(req.GetMetadataContext())
		return st.responseHeaders(v.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		st.phase = phaseRspBody
		st.count()
		st.readServed(req.GetMetadataContext())
		st.s.m.BodyBytes.WithLabelValues("response").Add(float64(len(v.ResponseBody.GetBody())))
		return st.responseBody(v.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.phase = phaseRspTrailers
		st.count()
		return st.responseTrailers()
	default:
		// Envoy always sets one phase (SVC ProcessingRequest.request is a required oneof).
		st.phase = phaseNone
		st.s.m.PhaseErrors.WithLabelValues(string(phaseNone), "protocol").Inc()
		return status.Error(codes.InvalidArgument, "kvroute: ProcessingRequest without a request phase")
	}
}

// headerLookup returns a lookup of h's headers by (lower-case) name, first value.
func headerLookup(h *extprocv3.HttpHeaders) func(string) string {
	return func(name string) string {
		for _, hv := range h.GetHeaders().GetHeaders() {
			if hv.GetKey() == name {
				return headerValue(hv)
			}
		}
		return ""
	}
}

// traceHeader reads the caller's W3C trace context headers (tracing.HeaderGetter).
func (st *stream) traceHeader(name string) string {
	switch name {
	case "traceparent":
		return st.traceparent
	case "tracestate":
		return st.tracestate
	}
	return ""
}

func (st *stream) count() { st.s.m.Messages.WithLabelValues(string(st.phase)).Inc() }

// reply sends r unless the stream no longer expects replies: after an ImmediateResponse
// Envoy ignores everything (CC onReceiveMessage, processing_complete_), and in
// observability mode replies are ignored (EP observability_mode).
func (st *stream) reply(r *extprocv3.ProcessingResponse) error {
	if st.failed || st.observability {
		return nil
	}
	st.replied = true
	if err := st.send(r); err != nil {
		if st.ctx.Err() == nil { // a send failing on a cancelled stream is the cancel, not a send error
			st.s.m.PhaseErrors.WithLabelValues(string(st.phase), "send").Inc()
		}
		return err
	}
	return nil
}

// ---- request headers -------------------------------------------------------------

func (st *stream) requestHeaders(h *extprocv3.HttpHeaders, md map[string]*structpb.Struct) error {
	if st.sawHeaders {
		st.s.m.PhaseErrors.WithLabelValues(string(st.phase), "protocol").Inc()
		return st.reply(headersReply(true, nil))
	}
	st.sawHeaders = true
	path := ""
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch hv.GetKey() {
		case ":path":
			path = headerValue(hv)
		case "x-request-id":
			st.requestID = headerValue(hv)
		case "traceparent":
			st.traceparent = headerValue(hv)
		case "tracestate":
			st.tracestate = headerValue(hv)
		case "content-length":
			if n, err := strconv.Atoi(headerValue(hv)); err == nil && n >= 0 {
				st.contentLength = n
			}
		default:
			if st.s.opt.Config.SLOHeader != "" && hv.GetKey() == st.s.opt.Config.SLOHeader {
				if ms, err := strconv.ParseFloat(headerValue(hv), 64); err == nil && ms > 0 && ms < 1e9 {
					st.slo = time.Duration(ms * float64(time.Millisecond))
				}
			}
		}
	}
	st.api = request.APIForPath(path)
	st.path, _, _ = strings.Cut(path, "?")
	st.route = tracing.StartRoute(st.ctx, st.s.opt.Tracer, st.traceHeader, string(st.api))
	if st.observability {
		st.s.m.Streams.WithLabelValues("observability").Inc()
		return nil
	}
	id, err := st.s.opt.Admission.Identify(admission.Input{Header: headerLookup(h), Metadata: md, EdgeHeaders: true, Peer: st.client})
	if err != nil {
		return st.immediate(err)
	}
	st.tenant = id
	st.classIn = admission.ClassInput{Tenant: id.Tenant, Header: headerLookup(h), Metadata: md}
	if h.GetEndOfStream() {
		// No body will follow in any body mode (PS no_body_): pick on headers alone.
		st.s.m.Streams.WithLabelValues("headers_only").Inc()
		return st.pickAndRelease(nil, true, releaseHeaders)
	}
	st.s.m.Streams.WithLabelValues(modeLabel(st.reqMode)).Inc()
	switch {
	case st.reqMode == modeBuffered || st.reqMode == modeBufferedPartial:
		// Envoy keeps holding the headers after this reply and releases them with the
		// body reply (PS handleHeadersResponse, BUFFERED branch; §5.1): pick there.
		if err := st.startBody(); err != nil {
			return err
		}
		return st.reply(headersReply(true, nil))
	case st.reqMode == modeFullDuplex || st.withoutWaiting:
		// Body chunks come without waiting for this reply; the headers are released by
		// it, so we withhold it until the body is parsed (PM ordering rule; PS
		// isValidBodyCallbackState).
		st.holdHeaders = true
		return st.startBody()
	default:
		// NONE, STREAMED, GRPC: the headers reply releases the headers to the router
		// before any body is seen (§5.1): pick on headers alone, load only.
		return st.pickAndRelease(nil, false, releaseHeaders)
	}
}

// maxBodyPrealloc caps how much of a declared content-length startBody reserves up
// front (bytes). Presizing to the full declared length (up to max_body_bytes, 16 MiB by
// default) would let a client that sends headers and then trickles — or never sends —
// the body pin that much memory per stream; past this cap the buffer grows with the
// bytes that actually arrive, and the 413 check counts those bytes.
const maxBodyPrealloc = 256 << 10

// startBody prepares body accumulation, presized from content-length when known (at
// most maxBodyPrealloc); a declared length over the limit is refused at once.
func (st *stream) startBody() error {
	max := st.s.opt.Config.MaxBodyBytes
	if st.contentLength > max {
		return st.immediate(request.TooLarge(max))
	}
	st.awaitingBody = true
	if st.reqMode != modeBuffered && st.contentLength > 0 {
		st.body = make([]byte, 0, min(st.contentLength, maxBodyPrealloc))
	}
	return nil
}

// ---- request body ----------------------------------------------------------------

func (st *stream) requestBody(b *extprocv3.HttpBody) error {
	if !st.awaitingBody || st.failed {
		return st.passRequestBody(b)
	}
	max := st.s.opt.Config.MaxBodyBytes
	switch {
	case st.reqMode == modeBuffered:
		// One message with the whole body (CC handleDataBufferedMode); end_of_stream is
		// false only when trailers follow (CC onTrailers). Its reply releases the headers.
		if len(b.GetBody()) > max {
			return st.immediate(request.TooLarge(max))
		}
		return st.pickAndRelease(b.GetBody(), true, releaseBody)
	case st.reqMode == modeBufferedPartial:
		// One message with what was queued up to the buffer limit; end_of_stream only if
		// the body ended (CC handleDataBufferedPartialMode). A cut body cannot be parsed:
		// sniff the model and pick on load.
		if len(b.GetBody()) > max {
			return st.immediate(request.TooLarge(max))
		}
		return st.pickAndRelease(b.GetBody(), b.GetEndOfStream(), releaseBody)
	}
	// FULL_DUPLEX_STREAMED or STREAMED with the headers reply withheld: accumulate.
	if len(st.body)+len(b.GetBody()) > max {
		return st.immediate(request.TooLarge(max))
	}
	st.body = append(st.body, b.GetBody()...)
	if !duplex(st.reqMode) {
		st.heldChunks++
	}
	if !b.GetEndOfStream() {
		return nil // empty non-final chunks included (envoyproxy/envoy#44101)
	}
	return st.pickAndRelease(st.body, true, releaseHeld)
}

// passRequestBody answers a request body message that needs no decision: in header
// SKIP mode (no headers seen), after the pick, in NONE/STREAMED/GRPC where the pick was
// made on headers, and a repeated end_of_stream (envoyproxy/envoy#46355).
func (st *stream) passRequestBody(b *extprocv3.HttpBody) error {
	if duplex(st.reqMode) {
		if st.reqEOSSent {
			return nil // nothing is owed after our final streamed_response
		}
		st.reqEOSSent = b.GetEndOfStream()
		return st.reply(streamedBodyReply(true, b.GetBody(), b.GetEndOfStream()))
	}
	return st.reply(bodyReply(true, nil))
}

func (st *stream) requestTrailers() error {
	if st.awaitingBody && !st.failed {
		if st.holdHeaders {
			// Trailers end the body (all chunks had end_of_stream=false, PM): pick,
			// release the held replies, then answer the trailers.
			if err := st.pickAndRelease(st.body, true, releaseHeldBeforeTrailers); err != nil || st.failed {
				return err
			}
		} else {
			st.s.m.PhaseErrors.WithLabelValues(string(st.phase), "protocol").Inc()
		}
	}
	return st.reply(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
}

// ---- the pick ----------------------------------------------------------------------

// release says which reply carries the decision (§5.1 table).
type release int

const (
	releaseHeaders            release = iota // the request headers reply (NONE, STREAMED, GRPC, headers-only)
	releaseBody                              // the request body reply (BUFFERED, BUFFERED_PARTIAL)
	releaseHeld                              // the withheld headers reply, then the body replies (FULL_DUPLEX, STREAMED without waiting)
	releaseHeldBeforeTrailers                // same, when trailers ended the body
)

// pickAndRelease parses body (nil: headers-only pick), picks and books a worker, and
// sends the reply that releases the headers with the destination. Any error becomes
// one ImmediateResponse.
func (st *stream) pickAndRelease(body []byte, complete bool, how release) error {
	st.awaitingBody = false
	ctx := st.route.Context(st.ctx)
	_, span := tracing.Start(ctx, st.s.opt.Tracer, tracing.SpanParse)
	req, err := st.parse(body, complete)
	span.End()
	if err == nil && complete && how != releaseHeaders {
		err = st.clientKVParams(body)
	}
	var pk admission.Picked
	if err == nil {
		st.req = req
		st.route.Set(tracing.Model(req.Model))
		if st.s.opt.Classify != nil { // off: nothing built, nothing run
			body, err = st.classify(req, body, complete, how) // classify.go
		}
	}
	if err == nil {
		// Holding a request in kvroute's queue is holding this reply: Envoy's
		// message_timeout must exceed the longest max_queue_time (docs/tenants.md, envoy.Check).
		// The stream's context ends when Envoy closes the stream (client gone): the
		// queued entry is removed.
		// Admit reserves the tenant's budget in the request's turn; a refusal aborts
		// the ticket and charges no fairness (VTC).
		pk, st.grant, err = st.s.opt.Admission.Admit(ctx, st.s.opt.Router, req, router.PickOptions{RequestID: st.requestID, SLO: st.slo,
			Subset: st.subset, SubsetHint: st.hasSubset, Fallbacks: st.s.opt.Config.FallbackEndpoints}, st.tenant, st.classIn)
		st.ticket = pk.Ticket
		if st.ticket != nil {
			st.flight = &front.Flight{Ticket: st.ticket, Grant: st.grant, Route: st.route, Aborts: st.s.m.Aborts}
		}
	}
	if err != nil {
		return st.immediate(err)
	}
	st.route.Set(st.ticket.TraceAttributes()...)
	if st.requestID == "" {
		st.requestID = st.ticket.RequestID
	}
	mut, md := st.destination()
	sent := body
	if complete && how != releaseHeaders {
		sent = st.upstreamBody(body) // usage.go: only in the modes that allow it
	}
	switch how {
	case releaseHeaders:
		return st.reply(withMetadata(headersReply(true, &extprocv3.CommonResponse{HeaderMutation: mut, ClearRouteCache: st.s.opt.Config.ClearRouteCache}), md))
	case releaseBody:
		// Header mutations in a body reply apply while Envoy still holds the headers
		// (SVC CommonResponse.header_mutation; PS BUFFERED). content-length stays valid:
		// the body is not mutated (PS validateContentLength), unless a client's
		// kv_transfer_params were removed or include_usage was injected, which sets it
		// to the new length.
		cr := &extprocv3.CommonResponse{HeaderMutation: mut, ClearRouteCache: st.s.opt.Config.ClearRouteCache}
		st.injectBuffered(cr, sent)
		return st.reply(withMetadata(bodyReply(true, cr), md))
	}
	if err := st.reply(withMetadata(headersReply(true, &extprocv3.CommonResponse{HeaderMutation: mut, ClearRouteCache: st.s.opt.Config.ClearRouteCache}), md)); err != nil {
		return err
	}
	st.holdHeaders = false
	eos := how == releaseHeld
	if duplex(st.reqMode) {
		// Envoy kept no copy of the body: every byte goes back in streamed_response, in
		// pieces ≤ 64 KiB, end_of_stream on the last only (PS handleDuplexStreamedBodyResponse).
		body := sent
		for len(body) > maxStreamedChunk {
			if err := st.reply(streamedBodyReply(true, body[:maxStreamedChunk], false)); err != nil {
				return err
			}
			body = body[maxStreamedChunk:]
		}
		st.reqEOSSent = eos
		err := st.reply(streamedBodyReply(true, body, eos))
		st.body = nil
		return err
	}
	// STREAMED: one reply per chunk, in order (PS handleStreamedBodyResponse).
	for ; st.heldChunks > 0; st.heldChunks-- {
		if err := st.reply(bodyReply(true, nil)); err != nil {
			return err
		}
	}
	st.body = nil
	return nil
}

// parse turns the body into a request. An incomplete body (nil for a pick on headers
// alone, or a BUFFERED_PARTIAL cut) gives a load-only request for the sniffed model.
func (st *stream) parse(body []byte, complete bool) (*request.Request, error) {
	if !complete {
		// A BUFFERED_PARTIAL cut: the rest of the body will pass without us, so the
		// last "model" before the cut is the best knowledge (a repeated key last-wins
		// as in a full parse; a cut "model" member gives no model).
		model, _ := request.SniffModel(body)
		return &request.Request{API: request.APIOther, Model: model}, nil
	}
	if len(body) > 0 {
		st.s.m.RequestBodySize.Observe(float64(len(body)))
	}
	return request.ParseBounded(st.api, body, st.s.opt.Router.MaxPromptIDs())
}
