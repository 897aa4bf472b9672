package extproc

import (
	"strconv"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
)

// ---- response direction ----------------------------------------------------------
//
// Envoy releases nothing on these replies that routing depends on; they only observe:
// :status, the first generated token (SSE), usage and the end of the response.

func (st *stream) responseHeaders(h *extprocv3.HttpHeaders) error {
	if st.ended() {
		return st.reply(headersReply(false, nil))
	}
	ct := ""
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch hv.GetKey() {
		case ":status":
			st.status, _ = strconv.Atoi(headerValue(hv))
		case "content-type":
			ct = headerValue(hv)
		}
	}
	sse := response.StreamBody(ct, st.req != nil && st.req.Stream)
	st.tracker = response.NewTracker(sse, 0)
	st.stripping = st.stripUsage && sse
	if st.grant.CountsTokens() {
		st.tracker.CountContent() // settlement without usage (not asked for, or cut) counts what streamed
	}
	var cr *extprocv3.CommonResponse
	if mut := st.responseMutation(); mut != nil {
		cr = &extprocv3.CommonResponse{HeaderMutation: mut}
	}
	switch {
	case h.GetEndOfStream():
		// No response body (PS no_body_): the response is complete (an inference
		// response without a body is truncated).
		st.complete(st.tracker.Result(st.status, st.inference()))
	case st.respMode == modeNone:
		// No response body is sent to us and Envoy closes the stream after this reply
		// (CC encodeHeaders → noExternalProcess, closeGrpcStreamIfLastRespReceived):
		// this is the last moment kvroute sees the request; count it complete, on
		// its status alone.
		st.complete(response.Result{Status: st.status, Outcome: response.StatusOutcome(st.status)})
	}
	return st.reply(headersReply(false, cr))
}

func (st *stream) responseBody(b *extprocv3.HttpBody) error {
	if !st.ended() {
		if st.tracker == nil { // response header mode SKIP
			st.tracker = response.NewTracker(st.req != nil && st.req.Stream, 0)
			st.stripping = st.stripUsage && st.req.Stream
		}
		if st.tracker.Write(b.GetBody()) {
			st.ticket.FirstToken(zeroTime)
			st.route.Event("first_token", zeroTime)
		}
		// The SSE end marker ([DONE], message_stop) completes the request: a client
		// that hangs up right after it makes Envoy reset the stream before the last
		// body message, and the request was still served.
		if b.GetEndOfStream() || st.tracker.Ended() {
			st.complete(st.tracker.Result(st.status, st.inference()))
		}
	}
	if duplex(st.respMode) {
		if st.rspEOSSent {
			return nil
		}
		st.rspEOSSent = b.GetEndOfStream()
		if st.stripping {
			return st.reply(st.strippedBody(b))
		}
		return st.reply(streamedBodyReply(false, b.GetBody(), b.GetEndOfStream()))
	}
	if st.stripping {
		return st.reply(st.strippedBody(b))
	}
	return st.reply(bodyReply(false, nil))
}

// responseTrailers is completion for responses that end with trailers (gRPC upstreams:
// the last body chunk has end_of_stream=false; GIE PR #2510, envoyproxy/envoy#37088).
func (st *stream) responseTrailers() error {
	if !st.ended() {
		if st.tracker != nil {
			st.complete(st.tracker.Result(st.status, st.inference()))
		} else {
			st.complete(response.Result{Status: st.status, Outcome: response.StatusOutcome(st.status)})
		}
	}
	return st.reply(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
}

func (st *stream) complete(res response.Result) {
	st.record(st.flight.Complete(res, st.countedTokens()))
}

// ended reports whether the stream has no ticket to end: none was booked, or it was
// completed or aborted already.
func (st *stream) ended() bool { return st.flight == nil || st.flight.Ended() }

// countedTokens is the generated tokens counted from the stream for the settlement:
// none when no response body was seen, -1 (estimate) when not counted (a non-SSE body,
// or response body mode NONE).
func (st *stream) countedTokens() int {
	if st.respMode == modeNone {
		return -1 // Envoy sends no response body: unknown, not none
	}
	return admission.Streamed(st.tracker)
}

// inference reports whether the request's path is an inference API (its 2xx body
// must end with a finish reason to be ok).
func (st *stream) inference() bool { return st.api != request.APIOther }

// finish ends the stream's ticket: a ticket not completed by now is aborted, with the
// reason counted. Safe to call more than once.
func (st *stream) finish(reason string) {
	if st.ended() {
		return
	}
	st.record(st.flight.Abort(reason, response.OutcomeAborted, st.countedTokens()))
}

// record counts the request once, with outcome o, on kvroute_extproc_requests_total.
func (st *stream) record(o response.Outcome) {
	if st.counted {
		return
	}
	st.counted = true
	st.s.m.Requests.WithLabelValues(string(o)).Inc()
}

// recordEnd counts, when the stream ends, a request that has not been counted: one
// that ended before kvroute picked a worker (aborted). Observability-mode streams and
// streams without request headers are not requests kvroute served.
func (st *stream) recordEnd() {
	if st.sawHeaders && !st.observability {
		st.record(response.OutcomeAborted)
	}
}
