package metrics

import "github.com/prometheus/client_golang/prometheus"

// ExtProc holds the metrics of the two fronts: the Envoy ext_proc server
// (kvroute_extproc_*) and the plain reverse proxy (kvroute_proxy_*).
type ExtProc struct {
	// Streams counts ext_proc streams by request body mode as Envoy announced it in
	// protocol_config (or as configured): none, streamed, buffered, buffered_partial,
	// full_duplex_streamed, grpc; "headers_only" when request headers had end_of_stream;
	// "observability" in observability mode.
	Streams *prometheus.CounterVec // mode
	// ActiveStreams is the number of open ext_proc streams.
	ActiveStreams prometheus.Gauge
	// Messages counts ProcessingRequests received, by phase.
	Messages *prometheus.CounterVec // phase
	// PhaseErrors counts failures by phase (request_headers … response_trailers, stream)
	// and kind: recv (stream error other than cancel/EOF), send, protocol (a message
	// Envoy should not send in that state), panic.
	PhaseErrors *prometheus.CounterVec // phase, kind
	// BodyBytes counts body bytes seen, by direction (request, response).
	BodyBytes *prometheus.CounterVec // direction
	// RequestBodySize is the size of the request bodies kvroute parsed, bytes.
	RequestBodySize prometheus.Histogram
	// ImmediateResponses counts local replies kvroute asked Envoy (or the proxy) to send, by status.
	ImmediateResponses *prometheus.CounterVec // status
	// OverheadSeconds is kvroute's processing time per ext_proc message: from receiving
	// a ProcessingRequest to sending its reply (for a held FULL_DUPLEX headers reply,
	// from the last body message to the reply). Phase labels as Messages.
	OverheadSeconds *prometheus.HistogramVec // phase
	// Aborts counts tickets ended by Abort, by reason: cancelled (Envoy reset the
	// stream), closed (Envoy half-closed before completion), recv_error, send_error, panic,
	// client_gone and upstream_error (proxy).
	Aborts *prometheus.CounterVec // reason
	// Panics counts recovered panics (ext_proc stream or proxy request).
	Panics prometheus.Counter
	// StreamsRefused counts ext_proc streams failed with RESOURCE_EXHAUSTED by a limit
	// (reason max_streams or message_rate).
	StreamsRefused *prometheus.CounterVec // reason

	// Requests counts requests that reached the ext_proc server, once each when it
	// ends, by outcome (response.Outcome: ok, client_error, upstream_error,
	// error_event, truncated, aborted, expired, or rejected when kvroute answered
	// itself). Observability-mode streams are not counted.
	Requests *prometheus.CounterVec // outcome
	// ProxyRequests counts requests answered by `kvroute proxy`, by status class
	// (2xx, 4xx, 5xx, or "error" when no response reached the client) and outcome
	// (as Requests).
	ProxyRequests *prometheus.CounterVec // code, outcome
	// ProxyUpstreamErrors counts upstream failures (connect, reset) of the proxy.
	ProxyUpstreamErrors prometheus.Counter
	// ProxyPrefillLegs counts the proxy's remote prefill legs (prefill/decode
	// disaggregation) by result: ok, or why the leg failed (connect_error, timeout,
	// status, no_kv_transfer_params, bad_response, unsupported_api); and each failure
	// by what followed it: retry (once, on another prefill worker) or fallback (local
	// prefill on the decode worker).
	ProxyPrefillLegs *prometheus.CounterVec // result
	// ClientKVParams counts request bodies that carried a client's kv_transfer_params,
	// by front (extproc, proxy) and action: stripped (removed before the body went
	// upstream), refused (a 400, where the ext_proc body mode cannot replace the body).
	ClientKVParams *prometheus.CounterVec // front, action
}

func newExtProc(reg prometheus.Registerer) *ExtProc {
	const sub = "extproc"
	return &ExtProc{
		Streams: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "streams_total", Help: "ext_proc streams by request body mode (none, streamed, buffered, buffered_partial, full_duplex_streamed, grpc, headers_only, observability)."}, []string{"mode"})),
		ActiveStreams: must(reg, prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "active_streams", Help: "Open ext_proc streams."})),
		Messages: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "messages_total", Help: "ProcessingRequests received, by phase."}, []string{"phase"})),
		PhaseErrors: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "phase_errors_total", Help: "ext_proc failures by phase and kind (recv, send, protocol, panic)."}, []string{"phase", "kind"})),
		BodyBytes: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "body_bytes_total", Help: "Body bytes seen by the ext_proc server, by direction (request, response)."}, []string{"direction"})),
		RequestBodySize: must(reg, prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: sub,
			Name: "request_body_size_bytes", Help: "Size of request bodies parsed for routing, bytes.", Buckets: prometheus.ExponentialBuckets(256, 4, 10)})),
		ImmediateResponses: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "immediate_responses_total", Help: "Local replies (ImmediateResponse, or the proxy's own error replies) by HTTP status."}, []string{"status"})),
		OverheadSeconds: must(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: sub,
			Name: "processing_duration_seconds", Help: "kvroute's time per ext_proc message, from receipt to reply, by phase.", Buckets: FastBuckets}, []string{"phase"})),
		Aborts: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "aborts_total", Help: "Requests whose ticket was aborted, by reason (cancelled, closed, recv_error, send_error, panic, client_gone, upstream_error)."}, []string{"reason"})),
		Panics: must(reg, prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "panics_total", Help: "Recovered panics in the ext_proc server or the proxy."})),
		StreamsRefused: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "streams_refused_total", Help: "ext_proc streams failed with RESOURCE_EXHAUSTED by a limit, by reason (max_streams, message_rate)."}, []string{"reason"})),
		Requests: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "requests_total", Help: "Requests seen by the ext_proc server, by outcome (ok, client_error, upstream_error, error_event, truncated, aborted, expired, rejected)."}, []string{"outcome"})),
		ProxyRequests: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: "proxy",
			Name: "requests_total", Help: "Requests answered by kvroute proxy, by status class (2xx, 3xx, 4xx, 5xx, error) and outcome (ok, client_error, upstream_error, error_event, truncated, aborted, expired, rejected)."}, []string{"code", "outcome"})),
		ProxyUpstreamErrors: must(reg, prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Subsystem: "proxy",
			Name: "upstream_errors_total", Help: "Upstream failures of kvroute proxy (connect errors, resets)."})),
		ProxyPrefillLegs: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: "proxy",
			Name: "pd_prefill_legs_total", Help: "Remote prefill legs of kvroute proxy (prefill/decode disaggregation), by result: ok, or the reason the leg failed (connect_error, timeout, status, no_kv_transfer_params, bad_response, unsupported_api); and what followed each failure: retry (sent once more to another prefill worker) or fallback (prefilled on the decode worker)."}, []string{"result"})),
		ClientKVParams: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "client_kv_transfer_params_total", Help: "Request bodies carrying a client's kv_transfer_params (only kvroute's prefill/decode pick may steer a KV transfer), by front (extproc, proxy) and action (stripped, refused)."}, []string{"front", "action"})),
	}
}
