package extproc

import (
	"bytes"
	"strconv"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvroute/kvroute/request"
)

// ---- stream_options.include_usage on the client's behalf ----------------------------
//
// As the proxy does (proxy.inject_include_usage): a streamed chat or completions request
// that names no stream_options goes to the worker with stream_options.include_usage
// true (request.WithIncludeUsage), and the usage-only chunk vLLM then sends last is
// removed from the client's stream (response.UsageFilter); the Tracker reads the
// unfiltered body, so usage settles budgets and calibrates the predictor, and the
// client gets what the engine would have sent it without kvroute.
//
// Envoy lets the processor replace a body only where its processing mode allows
// (§4 of the ext_proc reference; SVC BodyMutation, CommonResponse):
//   - request: BUFFERED — the whole body arrives in one message whose reply may carry
//     body_mutation.body, with the headers still held, so content-length is set in the
//     same reply (PS validateContentLength: a mismatch is a 500); FULL_DUPLEX_STREAMED —
//     Envoy keeps no copy and forwards only the streamed_response bytes kvroute sends.
//     STREAMED chunks have gone upstream before the body is parsed, BUFFERED_PARTIAL
//     may be cut, NONE is never seen: no injection.
//   - response: STREAMED — each chunk's reply may replace that chunk (body_mutation.body,
//     MU applyBodyMutations), content-length is already removed by Envoy (§4.4);
//     FULL_DUPLEX_STREAMED — streamed_response carries what goes on; BUFFERED — the whole
//     body is replaced in one reply, which removes content-length (headers still held).
//     NONE, BUFFERED_PARTIAL (the rest passes unprocessed) and GRPC cannot remove the
//     chunk: with them kvroute injects nothing, since the client would see a chunk it
//     did not ask for.

// injectModes reports whether stream_options.include_usage may be injected with this
// request and response body mode pair.
func injectModes(req, rsp mode) bool {
	reqOK := req == modeBuffered || req == modeFullDuplex
	rspOK := rsp == modeStreamed || rsp == modeBuffered || rsp == modeFullDuplex
	return reqOK && rspOK
}

// withIncludeUsage returns the body to send upstream: body with include_usage injected
// when the option is on, the modes allow it and the request qualifies (then
// st.stripUsage is set), else body itself.
func (st *stream) withIncludeUsage(body []byte) []byte {
	if !st.s.opt.Config.InjectIncludeUsage || !injectModes(st.reqMode, st.respMode) {
		return body
	}
	nb, ok := request.WithIncludeUsage(body, st.req)
	st.stripUsage = ok
	return nb
}

// injectBuffered adds the replaced body, and its content-length when the request
// declared one, to a BUFFERED request body reply.
func (st *stream) injectBuffered(cr *extprocv3.CommonResponse, sent []byte) {
	if !st.stripUsage {
		return
	}
	cr.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: sent}}
	if st.contentLength >= 0 {
		cr.HeaderMutation.SetHeaders = append(cr.HeaderMutation.SetHeaders, setHeader("content-length", strconv.Itoa(len(sent))))
	}
}

// strippedBody is the response body reply when the usage-only chunk is being removed:
// the bytes of this message the client gets (what the filter passes on now; at the end
// of the body or in BUFFERED mode, whatever it still holds).
func (st *stream) strippedBody(b *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	out := bytes.Clone(st.usage.Feed(b.GetBody()))
	if b.GetEndOfStream() || st.respMode == modeBuffered {
		out = append(out, st.usage.Flush()...)
	}
	if duplex(st.respMode) {
		return streamedBodyReply(false, out, b.GetEndOfStream())
	}
	cr := &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: out}}}
	if st.respMode == modeBuffered {
		cr.HeaderMutation = &extprocv3.HeaderMutation{RemoveHeaders: []string{"content-length"}}
	}
	return bodyReply(false, cr)
}
