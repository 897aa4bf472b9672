// Package extproc is kvroute's Envoy front: an envoy.service.ext_proc.v3
// ExternalProcessor. Envoy opens one gRPC stream per HTTP request; Server.Process runs
// one loop over it, stream.handle has the one type switch over the ProcessingRequest
// oneof, and each phase has one method. The package knows Envoy and nothing of
// scoring: it parses the body (package request), asks the router for a booked Ticket,
// writes the decision where Envoy reads it, and reports the response back to the
// ticket (FirstToken, Done, Abort).
//
// Citation keys name Envoy source files (CC ext_proc.cc, PS processor_state.cc, …); paths are in
// envoyproxy/envoy: CC source/extensions/filters/http/ext_proc/ext_proc.cc, PS
// …/processor_state.cc, MU …/mutation_utils.cc, PM/EP/SVC the ext_proc protos
// (api/envoy/extensions/filters/http/ext_proc/v3/{processing_mode,ext_proc}.proto,
// api/envoy/service/ext_proc/v3/external_processor.proto), OD the ORIGINAL_DST cluster,
// GIE the Gateway API Inference Extension endpoint-picker protocol.
//
// # Which mode
//
// The request and response body modes come from protocol_config on the first message
// of the stream (CC encodeProtocolConfig). Envoy releases before that field existed
// send none; then extproc.request_body_mode / extproc.response_body_mode say what the
// filter is configured with.
//
// # Where the decision is made (reference §5.1)
//
// The router filter chooses the host when ext_proc releases the request headers, so
// the destination must be in the reply that releases them:
//
//	request headers with end_of_stream      no body ever follows (PS no_body_): pick on
//	                                        headers alone; an inference path without a
//	                                        body is a 400, any other path a load-only pick.
//	NONE, STREAMED, GRPC                    the headers reply releases the headers before
//	                                        any body is seen: load-only pick on headers.
//	                                        STREAMED body chunks get one CONTINUE each, in
//	                                        order (PS handleStreamedBodyResponse), empty
//	                                        non-final ones too (envoyproxy/envoy#44101).
//	BUFFERED                                headers reply is a plain CONTINUE (Envoy keeps
//	                                        holding the headers, PS handleHeadersResponse);
//	                                        the one body message carries the whole body
//	                                        (CC handleDataBufferedMode), even with
//	                                        end_of_stream=false when trailers follow (CC
//	                                        onTrailers); its reply carries the decision.
//	                                        The body is mutated only to remove a
//	                                        client's kv_transfer_params and to inject
//	                                        stream_options.include_usage (usage.go), with
//	                                        content-length set to match in the same reply
//	                                        (PS validateContentLength).
//	BUFFERED_PARTIAL                        as BUFFERED, but the one message may be cut at
//	                                        Envoy's buffer limit (CC
//	                                        handleDataBufferedPartialMode): a cut body is
//	                                        not parsed; its model is sniffed and the pick
//	                                        is load-only. A whole body with a client's
//	                                        kv_transfer_params, which this mode cannot
//	                                        remove, is a 400 (so too in STREAMED without
//	                                        waiting).
//	FULL_DUPLEX_STREAMED                    chunks come without waiting for the headers
//	                                        reply and Envoy keeps no copy (CC
//	                                        handleDataStreamedModeBase). kvroute withholds
//	                                        the headers reply, accumulates the body, and at
//	                                        end_of_stream (or request trailers) sends the
//	                                        headers reply with the decision, then every
//	                                        byte back as streamed_response in pieces of at
//	                                        most 64 KiB with end_of_stream on the last only
//	                                        (PM ordering rule; PS isValidBodyCallbackState,
//	                                        handleDuplexStreamedBodyResponse), then the
//	                                        trailers reply if trailers came.
//	STREAMED with send_body_without_waiting_for_header_response
//	                                        as FULL_DUPLEX_STREAMED but replies are plain
//	                                        CONTINUEs, one per chunk, after the headers
//	                                        reply (EP; PS getCallbackStateAfterHeaderResp).
//	                                        Envoy's 200 ms message timeout runs on the
//	                                        withheld headers reply in this mode.
//
// The decision is a header mutation of extproc.destination_header (default
// x-gateway-destination-endpoint) set with raw_value and append=false, which
// overwrites any client-supplied value (Envoy reads raw_value only,
// envoyproxy/envoy#31555; append_action is ignored, #36982; OD warns the header is
// unsanitized), plus dynamic metadata {envoy.lb: {x-gateway-destination-endpoint:
// "ip:port"}} (GIE; EP metadata_options.receiving_namespaces). clear_route_cache is
// set only when extproc.clear_route_cache asks, and only on the reply that carries the
// mutation: ORIGINAL_DST/override_host read the header at host selection without it,
// and after the headers were released it is useless (PS clearRouteCache;
// envoyproxy/envoy#43708). kvroute never echoes request headers, so hop-by-hop headers
// (removed by Envoy before filters, CMU) are never set by it, nor content-length but
// for a BUFFERED body it replaced.
//
// # Limits and errors
//
// A body longer than extproc.max_body_bytes (declared by content-length, or
// accumulated) gets a 413. Every refusal goes through one mapping,
// front.ErrorReply, into an ImmediateResponse (accepted in every phase, SVC) with
// content-type application/json and the error body in the request's API shape
// (OpenAI's, or Anthropic's on /v1/messages): request errors 400
// (413), unknown model 404, no healthy worker 503, shed 429 with retry-after. After it
// Envoy stops processing the request and closes the stream (CC onReceiveMessage);
// later messages get no reply.
//
// # Response phases
//
// response_headers: :status is read, content-type text/event-stream (or the request's
// stream flag) selects SSE tracking; optional extproc.worker_header and
// extproc.predicted_ttft_header are added. end_of_stream on the headers, or a
// response body mode of NONE (Envoy closes the stream after this reply, CC
// encodeHeaders/noExternalProcess), completes the ticket there.
// response_body: chunks feed response.Tracker (events split across chunks,
// envoyproxy/envoy#45437); the first generated content calls Ticket.FirstToken;
// end_of_stream, or the SSE end marker (data: [DONE], Anthropic message_stop) when it
// comes first, calls Ticket.Complete with the usage and the outcome the status and body
// show (response.Outcome), counted once on kvroute_extproc_requests_total{outcome}
// (aborts and expiries included; kvroute's own refusals as "rejected"). A client that
// hangs up right after [DONE] was served. Replies are CONTINUE, or in
// FULL_DUPLEX_STREAMED streamed_response echoes of each chunk; when kvroute injected
// include_usage they carry the chunk without the usage-only event (body_mutation.body,
// or streamed_response; usage.go).
// response_trailers: completion for responses that end with trailers (gRPC upstreams;
// GIE PR #2510, envoyproxy/envoy#37088).
//
// # End of stream
//
// Envoy ends the stream after the last expected reply, on an immediate response, or
// on filter destruction (client disconnect, upstream reset), by default with a
// half-close plus RST_STREAM that the server sees as Canceled (or as io.EOF when it
// reads the half-close first), or with graceful close as io.EOF (GC close();
// envoyproxy/envoy#38195). No special message announces a
// client disconnect (CC onDestroy). So whenever Recv fails and the ticket is not
// complete, the ticket is aborted; Ticket.Abort after Done is a no-op, so no path
// leaks a booking. A repeated end_of_stream (envoyproxy/envoy#46355) gets a plain
// reply (none after our own final streamed_response). Observability mode gets no
// replies and no pick (EP observability_mode: Envoy does not wait). A panic is
// recovered per stream, counted, and the stream failed with INTERNAL.
package extproc
