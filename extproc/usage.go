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

// mutableRequest reports whether kvroute may replace the request body in request body
// mode req (the request half of the list above): BUFFERED, FULL_DUPLEX_STREAMED.
func mutableRequest(req mode) bool { return req == modeBuffered || req == modeFullDuplex }

// injectModes reports whether stream_options.include_usage may be injected with this
// request and response body mode pair.
func injectModes(req, rsp mode) bool {
	rspOK := rsp == modeStreamed || rsp == modeBuffered || rsp == modeFullDuplex
	return mutableRequest(req) && rspOK
}

// upstreamBody returns the body to send upstream, in the request body modes that allow
// replacing it (mutableRequest): without a client's kv_transfer_params
// (request.WithoutKVTransferParams: only kvroute's prefill/decode pick, through
// x-prefiller-host-port and the decode worker's sidecar, may steer a KV transfer), then
// with include_usage injected when the option is on, the response mode allows it and
// the request qualifies (then st.stripUsage is set). st.bodyMutated says whether it
// differs from the client's body (body itself may carry a classify rule's model). In other modes body itself (clientKVParams refuses what cannot be
// stripped there).
func (st *stream) upstreamBody(body []byte) []byte {
	if !mutableRequest(st.reqMode) {
		return body
	}
	nb, stripped := request.WithoutKVTransferParams(body, st.api, st.s.opt.Router.MaxPromptIDs())
	if stripped {
		st.s.m.ClientKVParams.WithLabelValues("extproc", "stripped").Inc()
	}
	if st.s.opt.Config.InjectIncludeUsage && injectModes(st.reqMode, st.respMode) {
		nb, st.stripUsage = request.WithIncludeUsage(nb, st.req)
	}
	st.bodyMutated = st.bodyMutated || stripped || st.stripUsage // or a model rewrite (classify.go)
	return nb
}

// clientKVParams is the 400 for a whole body that carries a client's
// kv_transfer_params in a request body mode where kvroute cannot remove them
// (BUFFERED_PARTIAL, STREAMED with send_body_without_waiting_for_header_response:
// the body passes on as Envoy holds it); nil when there are none, or the mode lets
// upstreamBody remove them.
func (st *stream) clientKVParams(body []byte) error {
	if mutableRequest(st.reqMode) {
		return nil
	}
	if _, ok := request.WithoutKVTransferParams(body, st.api, st.s.opt.Router.MaxPromptIDs()); !ok {
		return nil
	}
	st.s.m.ClientKVParams.WithLabelValues("extproc", "refused").Inc()
	return &request.Error{Status: 400, Type: "invalid_request_error", Param: "kv_transfer_params",
		Message: "kv_transfer_params is set by the router for prefill/decode disaggregation, not by clients"}
}

// injectBuffered adds the replaced body, and its content-length when the request
// declared one, to a BUFFERED request body reply.
func (st *stream) injectBuffered(cr *extprocv3.CommonResponse, sent []byte) {
	if !st.bodyMutated {
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
