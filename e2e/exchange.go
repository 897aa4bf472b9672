package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// exchange is one downstream request going through the stand-in.
type exchange struct {
	e       *Envoy
	w       http.ResponseWriter
	r       *http.Request
	side    *sideStream
	hdrs    headerList
	hasBody bool

	reqWG         sync.WaitGroup // request body pipeline goroutines
	bodyErrMu     sync.Mutex
	bodyErr       *localReply // failure inside the request body pipeline
	duplexStarted bool        // a FULL_DUPLEX body chunk was sent: errors are fail-closed (PR #41276)
	wroteHeaders  bool
	routeHdrs     headerList // the request headers the route was selected on (FallbackWorkers)
	routeCleared  bool       // a request-direction reply cleared the route cache: select again
	forwarded     bool
}

// upReq is what the router forwards upstream.
type upReq struct {
	headers headerList
	body    io.Reader
	length  int64 // content-length, -1 = chunked
}

func msgReqHeaders(h headerList, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: h.proto(), EndOfStream: eos}}}
}

func msgReqBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

func msgReqTrailers(t http.Header) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{Trailers: trailerMap(t)}}}
}

func msgRspHeaders(h headerList, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: h.proto(), EndOfStream: eos}}}
}

func msgRspBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

func msgRspTrailers(t http.Header) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{Trailers: trailerMap(t)}}}
}

func trailerMap(t http.Header) *corev3.HeaderMap {
	return responseHeaders(&http.Response{Header: t})[1:].proto()
}

// mutateBody applies a non-streamed body mutation (MU applyBodyMutations): body
// replaces, clear_body empties; streamed_response outside FULL_DUPLEX is a protocol
// error (PS handleStreamedBodyCallback).
func mutateBody(b []byte, cr *extprocv3.CommonResponse) ([]byte, bool, error) {
	switch m := cr.GetBodyMutation().GetMutation().(type) {
	case *extprocv3.BodyMutation_Body:
		return m.Body, true, nil
	case *extprocv3.BodyMutation_ClearBody:
		if m.ClearBody {
			return nil, true, nil
		}
	case *extprocv3.BodyMutation_StreamedResponse:
		return b, false, errors.New("streamed_response outside FULL_DUPLEX_STREAMED")
	}
	return b, false, nil
}

// setBodyErr records the first failure of the request body pipeline; a downstream
// reset replaces any other (the errors it causes on the side stream come after it).
func (x *exchange) setBodyErr(lr *localReply) {
	x.bodyErrMu.Lock()
	if x.bodyErr == nil || lr.reset {
		x.bodyErr = lr
	}
	x.bodyErrMu.Unlock()
}

// errDownstreamReset is a request body that ended before its end: the client closed or
// reset the connection before the declared content-length or the chunked terminator.
var errDownstreamReset = errors.New("downstream connection ended mid-body")

// readBody fills buf from the client's body until it is full or the body ends
// (eof). Any error other than the body's clean end is errDownstreamReset: Go's server
// reports a body cut by the connection's end as io.ErrUnexpectedEOF (or the socket's
// error), which is not an end of stream (io.ReadFull would conflate the two).
func (x *exchange) readBody(buf []byte) (n int, eof bool, err error) {
	for n < len(buf) {
		m, err := x.r.Body.Read(buf[n:])
		n += m
		if err == io.EOF {
			return n, true, nil
		}
		if err != nil {
			return n, false, fmt.Errorf("%w: %v", errDownstreamReset, err)
		}
	}
	return n, false, nil
}

// downstreamReset is what Envoy does when the client resets (or, on HTTP/1, closes)
// its connection mid-body: the HTTP stream is reset (HCM onResetStream, reason
// ConnectionTermination: a cut HTTP/1 message never ends with end_stream), which
// destroys the filter chain. The ext_proc filter closes its gRPC stream at once (CC
// onDestroy → closeStream; GC close(): half-close and reset, or the graceful close),
// having sent no body message for the cut body, and nothing is sent downstream.
func (x *exchange) downstreamReset() *localReply {
	x.e.stats.resets.Add(1)
	x.side.close()
	return &localReply{reset: true}
}

func (x *exchange) bodyFailure() *localReply {
	x.bodyErrMu.Lock()
	defer x.bodyErrMu.Unlock()
	return x.bodyErr
}

// dropsContentLength is PS shouldRemoveContentLength: STREAMED, FULL_DUPLEX_STREAMED,
// BUFFERED_PARTIAL, or BUFFERED with header mode SKIP (§4.4).
func dropsContentLength(m Mode) bool { return m == Streamed || m == FullDuplex || m == BufferedPartial }

func (x *exchange) applyHeaders(h headerList, cr *extprocv3.CommonResponse, mode Mode) (headerList, *localReply) {
	if !x.forwarded && cr.GetHeaderMutation() != nil && (cr.GetClearRouteCache() || x.e.cfg.RouteCacheClear) {
		x.routeCleared = true // honoured only with a header mutation, in the request direction (§5.2)
	}
	var rejected int
	h, err := h.apply(cr.GetHeaderMutation(), dropsContentLength(mode), &rejected)
	x.e.stats.rejected.Add(int64(rejected))
	if err != nil {
		return h, x.failure(err)
	}
	return h, nil
}

// requestPath runs the request-direction phases and returns what the router forwards.
func (x *exchange) requestPath() (*upReq, *localReply) {
	cfg := &x.e.cfg
	up := &upReq{headers: x.hdrs, body: x.r.Body, length: x.r.ContentLength}
	if !x.hasBody {
		up.body, up.length = nil, 0
	}
	if cfg.SkipRequestHeaders {
		return up, nil
	}
	mode := cfg.RequestBodyMode
	if !x.hasBody {
		mode = None // end_of_stream on headers: no body message in any mode (PS no_body_)
	}
	// Headers: Envoy pauses the request until the reply (CC onHeaders).
	if err := x.side.send(msgReqHeaders(x.hdrs, !x.hasBody)); err != nil {
		if lr := x.failure(err); lr != nil {
			return nil, lr
		}
	}
	if mode == FullDuplex {
		return x.requestFullDuplex(up)
	}
	cr, lr, ok := x.expect("request_headers", cfg.MessageTimeout)
	if lr != nil {
		return nil, lr
	}
	if ok {
		if up.headers, lr = x.applyHeaders(up.headers, cr, mode); lr != nil {
			return nil, lr
		}
	}
	switch mode {
	case Buffered:
		return x.requestBuffered(up)
	case BufferedPartial:
		return x.requestBufferedPartial(up)
	case Streamed:
		return x.requestStreamed(up)
	}
	return up, nil // NONE: headers released now; body flows untouched, content-length kept
}

// requestBuffered: one body message with the whole body once complete (CC
// handleDataBufferedMode); over the buffer limit → 413 (FM requestDataTooLarge);
// with trailers the body goes with end_of_stream=false, then the trailers (CC
// onTrailers). The body reply's header mutation still applies (headers held), and
// content-length is kept unless the body is replaced (PS validateContentLength).
func (x *exchange) requestBuffered(up *upReq) (*upReq, *localReply) {
	cfg := &x.e.cfg
	b, err := io.ReadAll(io.LimitReader(x.r.Body, int64(cfg.BufferLimit)+1))
	if err != nil { // io.ReadAll's only clean end is io.EOF
		return nil, x.downstreamReset()
	}
	if len(b) > cfg.BufferLimit {
		return nil, &localReply{status: 413, body: "Payload Too Large", details: "request_payload_too_large"}
	}
	trailers := cfg.RequestTrailers && len(x.r.Trailer) > 0
	if err := x.side.send(msgReqBody(b, !trailers)); err != nil {
		if lr := x.failure(err); lr != nil {
			return nil, lr
		}
	}
	cr, lr, ok := x.expect("request_body", cfg.MessageTimeout)
	if lr != nil {
		return nil, lr
	}
	if ok {
		if up.headers, lr = x.applyHeaders(up.headers, cr, Buffered); lr != nil {
			return nil, lr
		}
		nb, mutated, err := mutateBody(b, cr)
		if err != nil {
			return nil, x.failure(fmt.Errorf("%w: %v", errMutation, err))
		}
		if mutated {
			if cl := up.headers.get("content-length"); cl != "" && cl != strconv.Itoa(len(nb)) {
				return nil, x.failure(fmt.Errorf("%w: %s", errMutation, "mismatch between content length and the length of the mutated body"))
			}
			b = nb
		}
	}
	if trailers {
		if err := x.side.send(msgReqTrailers(x.r.Trailer)); err != nil {
			if lr := x.failure(err); lr != nil {
				return nil, lr
			}
		}
		if _, lr, _ := x.expect("request_trailers", cfg.MessageTimeout); lr != nil {
			return nil, lr
		}
	}
	up.body, up.length = bytes.NewReader(b), int64(len(b))
	return up, nil
}

// requestBufferedPartial: what is queued up to the buffer limit (or the whole body) goes
// as one message, end_of_stream only if the body ended; its reply releases the headers;
// the rest passes through unprocessed (CC handleDataBufferedPartialMode; PS).
func (x *exchange) requestBufferedPartial(up *upReq) (*upReq, *localReply) {
	cfg := &x.e.cfg
	b := make([]byte, cfg.BufferLimit)
	n, ended, err := x.readBody(b)
	if err != nil {
		return nil, x.downstreamReset()
	}
	b = b[:n]
	if !ended {
		// exactly BufferLimit bytes read: peek for more
		var one [1]byte
		m, eof, err := x.readBody(one[:])
		switch {
		case err != nil:
			return nil, x.downstreamReset()
		case m == 0 && eof:
			ended = true
		default:
			up.body = io.MultiReader(bytes.NewReader(one[:m]), x.r.Body)
		}
	}
	if err := x.side.send(msgReqBody(b, ended)); err != nil {
		if lr := x.failure(err); lr != nil {
			return nil, lr
		}
	}
	cr, lr, ok := x.expect("request_body", cfg.MessageTimeout)
	if lr != nil {
		return nil, lr
	}
	if ok {
		if up.headers, lr = x.applyHeaders(up.headers, cr, BufferedPartial); lr != nil {
			return nil, lr
		}
		if b, _, err = mutateBody(b, cr); err != nil {
			return nil, x.failure(fmt.Errorf("%w: %v", errMutation, err))
		}
	}
	up.headers = up.headers.del("content-length")
	if ended {
		up.body = bytes.NewReader(b)
	} else {
		up.body = io.MultiReader(bytes.NewReader(b), up.body)
	}
	up.length = -1
	return up, nil
}

// chunk is one request body message in flight.
type chunk struct {
	data     []byte
	eos      bool
	trailers bool // this is the trailers message
}

// readChunks slices the body as a codec would (ChunkSize slices) and calls emit for each,
// with end_of_stream on the last data chunk — or on an empty final chunk when the body
// was empty (the HTTP/1 chunked terminator: envoyproxy/envoy#40340) — unless trailers
// follow, in which case every chunk has end_of_stream=false and a trailers message ends
// the body (PS finalizeBodyResponse; PM). A body cut by the client's hang-up returns
// errDownstreamReset with no end_of_stream sent: the caller resets (downstreamReset).
func (x *exchange) readChunks(emit func(chunk) error) error {
	cfg := &x.e.cfg
	buf := make([]byte, cfg.ChunkSize)
	var pending []byte
	havePending := false
	for {
		n, eof, err := x.readBody(buf)
		if err != nil {
			return err
		}
		if n > 0 {
			if havePending {
				if e := emit(chunk{data: pending}); e != nil {
					return e
				}
			}
			pending, havePending = append([]byte(nil), buf[:n]...), true
		}
		if eof {
			break
		}
	}
	trailers := cfg.RequestTrailers && len(x.r.Trailer) > 0
	if !havePending {
		pending = []byte{}
	}
	if err := emit(chunk{data: pending, eos: !trailers}); err != nil {
		return err
	}
	if trailers {
		return emit(chunk{trailers: true})
	}
	return nil
}

// requestStreamed: the headers reply released the headers; each chunk is sent without
// waiting for earlier replies (pipelined), replies are applied in order to the oldest
// outstanding chunk and re-injected (CC handleDataStreamedMode, PS
// handleStreamedBodyResponse). content-length is removed (§4.4).
func (x *exchange) requestStreamed(up *upReq) (*upReq, *localReply) {
	cfg := &x.e.cfg
	pr, pw := io.Pipe()
	queue := make(chan chunk, 1024)
	x.reqWG.Add(2)
	go func() { // sender
		defer x.reqWG.Done()
		defer close(queue)
		err := x.readChunks(func(c chunk) error {
			var m *extprocv3.ProcessingRequest
			if c.trailers {
				m = msgReqTrailers(x.r.Trailer)
			} else {
				m = msgReqBody(c.data, c.eos)
			}
			if err := x.side.send(m); err != nil {
				return err
			}
			queue <- c
			return nil
		})
		switch {
		case errors.Is(err, errDownstreamReset):
			x.setBodyErr(x.downstreamReset())
			pw.CloseWithError(err)
		case err != nil && err != errClosedOK:
			x.setBodyErr(x.failure(err))
			pw.CloseWithError(err)
		}
	}()
	go func() { // receiver: one reply per chunk, in order
		defer x.reqWG.Done()
		for c := range queue {
			want := "request_body"
			if c.trailers {
				want = "request_trailers"
			}
			cr, lr, ok := x.expect(want, cfg.MessageTimeout)
			if lr != nil {
				x.setBodyErr(lr)
				pw.CloseWithError(errors.New("ext_proc failed"))
				for range queue {
				}
				return
			}
			data := c.data
			if ok && !c.trailers {
				var err error
				if data, _, err = mutateBody(data, cr); err != nil {
					x.setBodyErr(x.failure(err))
					pw.CloseWithError(err)
					for range queue {
					}
					return
				}
			}
			if len(data) > 0 {
				if _, err := pw.Write(data); err != nil {
					for range queue {
					}
					return
				}
			}
		}
		pw.Close()
	}()
	up.headers = up.headers.del("content-length")
	up.body, up.length = pr, -1
	return up, nil
}

// requestFullDuplex: chunks go as they arrive, before the headers reply; Envoy keeps no
// copy (CC handleDataStreamedModeBase). The server must reply headers first (a body
// reply before it is spurious: PS isValidBodyCallbackState), then streamed_response
// bodies (anything else is a protocol error: PS handleStreamedBodyCallback), whose
// bytes are all that reaches upstream; end_of_stream ends the body; then the trailers
// reply. No per-message timer in this mode (EP message_timeout).
func (x *exchange) requestFullDuplex(up *upReq) (*upReq, *localReply) {
	x.duplexStarted = true
	x.reqWG.Add(1)
	go func() {
		defer x.reqWG.Done()
		err := x.readChunks(func(c chunk) error {
			if c.trailers {
				return x.side.send(msgReqTrailers(x.r.Trailer))
			}
			return x.side.send(msgReqBody(c.data, c.eos))
		})
		if errors.Is(err, errDownstreamReset) {
			x.setBodyErr(x.downstreamReset()) // the headers reply it waits for fails now
		}
	}()
	cr, lr, ok := x.expect("request_headers", 0)
	if lr != nil {
		x.reqWG.Wait()
		return nil, lr
	}
	if ok {
		if up.headers, lr = x.applyHeaders(up.headers, cr, FullDuplex); lr != nil {
			x.reqWG.Wait()
			return nil, lr
		}
	}
	trailers := x.e.cfg.RequestTrailers
	pr, pw := io.Pipe()
	x.reqWG.Add(1)
	go func() {
		defer x.reqWG.Done()
		for {
			r, err := x.side.await(0)
			if err != nil {
				if err != errClosedOK {
					x.setBodyErr(x.failure(err))
				}
				pw.CloseWithError(errors.New("ext_proc stream ended"))
				return
			}
			if ir := r.GetImmediateResponse(); ir != nil {
				x.setBodyErr(x.immediate(ir))
				pw.CloseWithError(errors.New("immediate response"))
				return
			}
			if r.GetRequestTrailers() != nil && trailers {
				pw.Close()
				return
			}
			sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				x.setBodyErr(x.failure(errSpurious))
				pw.CloseWithError(errSpurious)
				return
			}
			if len(sr.GetBody()) > 0 {
				if _, err := pw.Write(sr.GetBody()); err != nil {
					return
				}
			}
			if sr.GetEndOfStream() {
				pw.Close()
				return
			}
		}
	}()
	up.headers = up.headers.del("content-length")
	up.body, up.length = pr, -1
	return up, nil
}
