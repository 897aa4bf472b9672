package extproc

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/classify"
	"github.com/kvroute/kvroute/front"
	"github.com/kvroute/kvroute/response"
	"go.opentelemetry.io/otel/attribute"
)

var zeroTime time.Time

// headerValue reads a header sent by Envoy: raw_value (what Envoy fills since
// send_header_raw_value, MU headersToProto), else value (older Envoy).
func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

// setHeader is an overwriting set (append=false: Envoy replaces every existing entry,
// so a client-supplied value is never kept; append_action is ignored by ext_proc,
// envoyproxy/envoy#36982). The value goes in raw_value only: value-only mutations
// become empty headers and both set is an error (envoyproxy/envoy#31555; MU).
func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: key, RawValue: []byte(value)}}
}

func headersReply(request bool, cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	hr := &extprocv3.HeadersResponse{Response: cr}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: hr}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: hr}}
}

func bodyReply(request bool, cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: cr}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}

// streamedBodyReply carries body bytes back in FULL_DUPLEX_STREAMED (SVC StreamedBodyResponse).
func streamedBodyReply(request bool, body []byte, eos bool) *extprocv3.ProcessingResponse {
	return bodyReply(request, &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: eos}}}})
}

func withMetadata(r *extprocv3.ProcessingResponse, md *structpb.Struct) *extprocv3.ProcessingResponse {
	r.DynamicMetadata = md
	return r
}

// destination is the decision as Envoy reads it: the destination header (ORIGINAL_DST
// use_http_header / override_host, OD; OH) and dynamic metadata
// {<namespace>: {<header>: "ip:port"}} (GIE endpoint picker protocol; envoy.lb is what
// ORIGINAL_DST metadata_key and override_host read). Namespace "" disables metadata.
func (st *stream) destination() (*extprocv3.HeaderMutation, *structpb.Struct) {
	cfg := &st.s.opt.Config
	// With extproc.fallback_endpoints the value is the protocol's ordered list
	// "ip:port,ip:port,...": the pick, then the next best (override_host splits it; the
	// header and the metadata carry the same value, as the protocol requires).
	dest := st.ticket.Address
	if len(st.ticket.Fallbacks) > 0 {
		dest = strings.Join(append([]string{dest}, st.ticket.Fallbacks...), ",")
	}
	mut := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(cfg.DestinationHeader, dest)}}
	// The upstream request continues the trace from kvroute's route span (W3C
	// traceparent/tracestate, overwriting the caller's), so vLLM's spans join it.
	st.route.Inject(func(k, v string) { mut.SetHeaders = append(mut.SetHeaders, setHeader(k, v)) })
	// With the classify stage on, its tag header is kvroute's word: set (overwriting a
	// client's copy; ext_proc set_headers replace unless append is true) or removed.
	if st.s.opt.Classify != nil {
		for _, kv := range st.tags {
			mut.SetHeaders = append(mut.SetHeaders, setHeader(kv[0], kv[1]))
		}
		if len(st.tags) == 0 {
			mut.RemoveHeaders = append(mut.RemoveHeaders, classify.TagHeader)
		}
	}
	// Prefill/decode disaggregation, llm-d's convention: the destination is the decode
	// worker and the prefill worker rides in PrefillHeader, which the sidecar beside the
	// decode worker reads to run the prefill leg first. Set (overwriting) or removed: a
	// client never chooses its prefill worker.
	prefill := ""
	if st.ticket.PrefillAddress != "" && st.ticket.RemotePrefill() {
		prefill = st.ticket.PrefillAddress
		mut.SetHeaders = append(mut.SetHeaders, setHeader(PrefillHeader, prefill))
	} else {
		mut.RemoveHeaders = append(mut.RemoveHeaders, PrefillHeader)
	}
	if cfg.MetadataNamespace == "" {
		return mut, nil
	}
	fields := map[string]*structpb.Value{cfg.DestinationHeader: structpb.NewStringValue(dest)}
	if prefill != "" {
		fields[PrefillHeader] = structpb.NewStringValue(prefill)
	}
	md := &structpb.Struct{Fields: map[string]*structpb.Value{cfg.MetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: fields})}}
	return mut, md
}

// PrefillHeader names the remote prefill worker ("ip:port") of a disaggregated request
// for the sidecar on the decode worker (llm-d-inference-scheduler's routing sidecar and
// P/D profile handler, header x-prefiller-host-port). It is also written under the
// metadata namespace next to the destination.
const PrefillHeader = "x-prefiller-host-port"

// responseMutation adds the optional informational response headers; nil when none.
func (st *stream) responseMutation() *extprocv3.HeaderMutation {
	cfg := &st.s.opt.Config
	var set []*corev3.HeaderValueOption
	if cfg.WorkerHeader != "" {
		set = append(set, setHeader(cfg.WorkerHeader, st.ticket.Worker))
	}
	if cfg.PredictedTTFTHeader != "" && st.ticket.Predicted.TTFT > 0 {
		ms := math.Round(float64(st.ticket.Predicted.TTFT) / float64(time.Millisecond))
		set = append(set, setHeader(cfg.PredictedTTFTHeader, strconv.FormatFloat(ms, 'f', 0, 64)))
	}
	if set == nil {
		return nil
	}
	return &extprocv3.HeaderMutation{SetHeaders: set}
}

// immediate turns any error of the request's journey into Envoy's local reply, through
// the one mapping both fronts share (front.ErrorReply): status, content-type
// application/json (+ retry-after on 429), the error JSON in the request's API shape
// (OpenAI's, or Anthropic's on /v1/messages), and details. Envoy
// then stops processing and closes the stream (CC onReceiveMessage; SVC ImmediateResponse).
func (st *stream) immediate(err error) error {
	r := front.ErrorReply(st.api, err)
	st.s.m.ImmediateResponses.WithLabelValues(strconv.Itoa(r.Status)).Inc()
	st.route.Set(attribute.Int("http.response.status_code", r.Status))
	st.route.Fail(http.StatusText(r.Status))
	st.s.log.Debug("ext_proc: immediate response", "request_id", st.requestID, "status", r.Status, "err", err)
	hm := &extprocv3.HeaderMutation{}
	for _, h := range r.Header {
		hm.SetHeaders = append(hm.SetHeaders, setHeader(h[0], h[1]))
	}
	resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: typev3.StatusCode(r.Status)}, Headers: hm, Body: r.Body, Details: r.Details}}}
	err = st.reply(resp)
	st.record(response.OutcomeRejected)
	st.failed = true
	st.awaitingBody, st.holdHeaders, st.body = false, false, nil
	return err
}
