package e2e

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// responsePath runs the response-direction phases and writes the downstream response.
// Envoy's own local replies never come here (§2.1).
func (x *exchange) responsePath(resp *http.Response) {
	cfg := &x.e.cfg
	h := responseHeaders(resp)
	hasBody := x.r.Method != http.MethodHead && resp.StatusCode != 204 && resp.StatusCode != 304 && resp.ContentLength != 0
	mode := cfg.ResponseBodyMode
	if !hasBody {
		mode = None
	}
	timeout := cfg.MessageTimeout
	if mode == FullDuplex {
		timeout = 0 // no per-message timer in FULL_DUPLEX_STREAMED, headers reply included (PS onStartProcessorCall)
	}
	if !cfg.SkipResponseHeaders && !x.side.isDone() {
		if err := x.side.send(msgRspHeaders(h, !hasBody)); err != nil {
			if lr := x.failure(err); lr != nil {
				x.localReply(lr)
				return
			}
		} else {
			cr, lr, ok := x.expect("response_headers", timeout)
			if lr != nil {
				x.localReply(lr)
				return
			}
			if ok {
				if h, lr = x.applyHeaders(h, cr, mode); lr != nil {
					x.localReply(lr)
					return
				}
			}
		}
	}
	if mode == None && !cfg.ResponseTrailers {
		// Nothing more to process: Envoy closes the stream now (CC encodeHeaders →
		// noExternalProcess; closeGrpcStreamIfLastRespReceived).
		x.side.close()
	}
	if x.side.isDone() {
		mode = None
	}
	switch mode {
	case Buffered:
		x.responseBuffered(resp, h)
	case Streamed, BufferedPartial:
		x.responseStreamed(resp, h)
	case FullDuplex:
		x.responseFullDuplex(resp, h)
	default:
		x.writeHeaders(h, !dropsContentLength(cfg.ResponseBodyMode) || !hasBody)
		x.copyBody(resp.Body)
	}
}

// writeHeaders writes the (mutated) response headers downstream. Hop-by-hop headers
// are removed by the HCM when it encodes downstream (CMU mutateResponseHeaders).
func (x *exchange) writeHeaders(h headerList, keepContentLength bool) {
	st, _ := strconv.Atoi(h.get(":status"))
	wh := x.w.Header()
	for _, kv := range h {
		if strings.HasPrefix(kv[0], ":") || hopByHop[kv[0]] || (kv[0] == "content-length" && !keepContentLength) {
			continue
		}
		wh.Add(kv[0], kv[1])
	}
	x.w.WriteHeader(st)
	x.wroteHeaders = true
}

func (x *exchange) flush() { _ = http.NewResponseController(x.w).Flush() }

func (x *exchange) copyBody(r io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := x.w.Write(buf[:n]); werr != nil {
				return
			}
			x.flush()
		}
		if err != nil {
			return
		}
	}
}

// responseBuffered: whole body in one message (500 over the buffer limit, FM
// responseDataTooLarge); headers held until the body reply, whose header mutation applies.
func (x *exchange) responseBuffered(resp *http.Response, h headerList) {
	cfg := &x.e.cfg
	b, err := io.ReadAll(io.LimitReader(resp.Body, int64(cfg.BufferLimit)+1))
	if err != nil {
		x.localReply(&localReply{status: 503, body: "upstream reset", details: "upstream_reset_after_response_started"})
		return
	}
	if len(b) > cfg.BufferLimit {
		x.localReply(&localReply{status: 500, body: "Internal Server Error", details: "response_payload_too_large"})
		return
	}
	trailers := cfg.ResponseTrailers && len(resp.Trailer) > 0
	if err := x.side.send(msgRspBody(b, !trailers)); err == nil {
		cr, lr, ok := x.expect("response_body", cfg.MessageTimeout)
		if lr != nil {
			x.localReply(lr)
			return
		}
		if ok {
			if h, lr = x.applyHeaders(h, cr, Buffered); lr != nil {
				x.localReply(lr)
				return
			}
			if nb, mutated, err := mutateBody(b, cr); err == nil && mutated {
				b = nb
				h = h.del("content-length")
			}
		}
	}
	if trailers {
		x.sendResponseTrailers(resp.Trailer)
	}
	x.writeHeaders(h, true)
	_, _ = x.w.Write(b)
}

// responseStreamed: headers go downstream after the headers reply; each chunk is sent,
// its reply applied and the result written and flushed; the body ends with an empty
// end_of_stream chunk (envoyproxy/envoy#40340) or, when the upstream sent trailers and
// trailer mode is SEND, with the trailers message instead (PS finalizeBodyResponse).
func (x *exchange) responseStreamed(resp *http.Response, h headerList) {
	cfg := &x.e.cfg
	x.writeHeaders(h, false)
	buf := make([]byte, cfg.ChunkSize)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if !x.streamChunk(buf[:n], false) {
				return
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return // upstream reset or client gone: the deferred close resets the side stream
		}
	}
	if cfg.ResponseTrailers && len(resp.Trailer) > 0 {
		x.sendResponseTrailers(resp.Trailer)
		return
	}
	x.streamChunk(nil, true)
}

func (x *exchange) streamChunk(b []byte, eos bool) bool {
	if !x.side.isDone() {
		if err := x.side.send(msgRspBody(b, eos)); err == nil {
			cr, lr, ok := x.expect("response_body", x.e.cfg.MessageTimeout)
			if lr != nil {
				panic(http.ErrAbortHandler) // response started: Envoy resets the stream (SVC)
			}
			if ok {
				if nb, _, err := mutateBody(b, cr); err == nil {
					b = nb
				}
			}
		}
	}
	if len(b) > 0 {
		if _, err := x.w.Write(b); err != nil {
			return false
		}
		x.flush()
	}
	return true
}

func (x *exchange) sendResponseTrailers(t http.Header) {
	if x.side.isDone() {
		return
	}
	if err := x.side.send(msgRspTrailers(t)); err == nil {
		x.expect("response_trailers", x.e.cfg.MessageTimeout)
	}
}

// responseFullDuplex: chunks go as they arrive; only streamed_response bytes reach the
// client (PS handleDuplexStreamedBodyResponse).
func (x *exchange) responseFullDuplex(resp *http.Response, h headerList) {
	x.writeHeaders(h, false)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, x.e.cfg.ChunkSize)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				if x.side.send(msgRspBody(bytes.Clone(buf[:n]), false)) != nil {
					return
				}
			}
			if err != nil {
				if err == io.EOF {
					if len(resp.Trailer) > 0 {
						_ = x.side.send(msgRspTrailers(resp.Trailer))
					} else {
						_ = x.side.send(msgRspBody(nil, true))
					}
				}
				return
			}
		}
	}()
	defer func() { <-done }()
	for {
		r, err := x.side.await(0)
		if err != nil {
			return
		}
		if r.GetResponseTrailers() != nil {
			return
		}
		sr := r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			panic(http.ErrAbortHandler) // protocol error after the response started: reset
		}
		if len(sr.GetBody()) > 0 {
			if _, err := x.w.Write(sr.GetBody()); err != nil {
				return
			}
			x.flush()
		}
		if sr.GetEndOfStream() {
			return
		}
	}
}
