package extproc

import (
	"strconv"
	"strings"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvroute/kvroute/response"
)

// ---- response direction ----------------------------------------------------------
//
// Envoy releases nothing on these replies that routing depends on; they only observe:
// :status, the first generated token (SSE), usage and the end of the response.

func (st *stream) responseHeaders(h *extprocv3.HttpHeaders) error {
	if st.ticket == nil || st.completed {
		return st.reply(headersReply(false, nil))
	}
	sse := false
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch hv.GetKey() {
		case ":status":
			st.status, _ = strconv.Atoi(headerValue(hv))
		case "content-type":
			sse = strings.HasPrefix(headerValue(hv), "text/event-stream")
		}
	}
	st.tracker = response.NewTracker(sse || (st.req != nil && st.req.Stream), 0)
	var cr *extprocv3.CommonResponse
	if mut := st.responseMutation(); mut != nil {
		cr = &extprocv3.CommonResponse{HeaderMutation: mut}
	}
	switch {
	case h.GetEndOfStream():
		// No response body (PS no_body_): the response is complete.
		st.complete(response.Usage{})
	case st.respMode == modeNone:
		// No response body is sent to us and Envoy closes the stream after this reply
		// (CC encodeHeaders → noExternalProcess, closeGrpcStreamIfLastRespReceived):
		// this is the last moment kvroute sees the request; count it complete.
		st.complete(response.Usage{})
	}
	return st.reply(headersReply(false, cr))
}

func (st *stream) responseBody(b *extprocv3.HttpBody) error {
	if st.ticket != nil && !st.completed {
		if st.tracker == nil { // response header mode SKIP
			st.tracker = response.NewTracker(st.req != nil && st.req.Stream, 0)
		}
		if st.tracker.Write(b.GetBody()) {
			st.ticket.FirstToken(zeroTime)
			st.route.Event("first_token", zeroTime)
		}
		if b.GetEndOfStream() {
			st.complete(st.tracker.Finish())
		}
	}
	if duplex(st.respMode) {
		if st.rspEOSSent {
			return nil
		}
		st.rspEOSSent = b.GetEndOfStream()
		return st.reply(streamedBodyReply(false, b.GetBody(), b.GetEndOfStream()))
	}
	return st.reply(bodyReply(false, nil))
}

// responseTrailers is completion for responses that end with trailers (gRPC upstreams:
// the last body chunk has end_of_stream=false; GIE PR #2510, envoyproxy/envoy#37088).
func (st *stream) responseTrailers() error {
	if st.ticket != nil && !st.completed {
		u := response.Usage{}
		if st.tracker != nil {
			u = st.tracker.Finish()
		}
		st.complete(u)
	}
	return st.reply(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
}

func (st *stream) complete(u response.Usage) {
	st.completed = true
	st.ticket.Done(st.status, u, zeroTime)
	st.route.Completed(st.status, u)
}

// finish ends the stream's ticket: a ticket not completed by now is aborted, with the
// reason counted. Safe to call more than once.
func (st *stream) finish(reason string) {
	if st.ticket == nil || st.completed {
		return
	}
	st.completed = true
	st.ticket.Abort()
	st.s.m.Aborts.WithLabelValues(reason).Inc()
	st.route.Fail("aborted: " + reason)
}
