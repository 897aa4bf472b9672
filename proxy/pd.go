package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/classify"
	"github.com/kvroute/kvroute/internal/jsonvalue"
	"github.com/kvroute/kvroute/request"
)

// The proxy's two-step prefill/decode exchange (docs/pd-delivery.md): for a ticket with a
// remote prefill (router.Ticket.RemotePrefill) the proxy is the P/D proxy vLLM's
// disaggregated serving examples and llm-d's routing sidecar are. The prefill leg is
// the request with kv_transfer_params {"do_remote_decode": true, "do_remote_prefill":
// false, "remote_engine_id": null, "remote_block_ids": null, "remote_host": null,
// "remote_port": null}, "stream": false, "max_tokens": 1 ("max_completion_tokens": 1 when
// the client set it) and no "stream_options" (vLLM
// tests/v1/kv_connector/nixl_integration/toy_proxy_server.py,
// send_request_to_service; llm-d-inference-scheduler pkg/sidecar/proxy
// connector_nixlv2.go), sent to PrefillAddress on the request's path; the decode leg is
// the client's request with the kv_transfer_params the prefill answered, sent to
// Address and streamed back as any proxied request. Both legs carry one X-Request-Id.

// maxPrefillResponseBytes bounds the prefill leg's response body (bytes): one token of
// text and the block ids (a 128k-token prompt in 16-token blocks is 8,192 ids).
const maxPrefillResponseBytes = 4 << 20

// Prefill-leg failure results (kvroute_proxy_pd_prefill_legs_total{result}).
const (
	pdConnect        = "connect_error"
	pdTimeout        = "timeout"
	pdStatus         = "status"
	pdNoKVParams     = "no_kv_transfer_params"
	pdBadResponse    = "bad_response"
	pdUnsupportedAPI = "unsupported_api"
)

// Outcomes of a failed prefill leg (kvroute_proxy_pd_prefill_legs_total{result}, next
// to the leg's own result): retried once on another prefill worker, or prefilled on
// the decode worker.
const (
	pdRetry    = "retry"
	pdFallback = "fallback"
)

// prefillError is a failed prefill leg; Result is its kvroute_proxy_pd_prefill_legs_total
// label, Status the prefill worker's HTTP status for pdStatus.
type prefillError struct {
	Result string
	Err    error
	Status int
}

func (e *prefillError) Error() string { return "remote prefill: " + e.Result + ": " + e.Err.Error() }
func (e *prefillError) Unwrap() error { return e.Err }

// retryable reports whether another prefill worker may succeed where this one failed:
// not for an API without kv_transfer_params, nor for a 4xx (the request's own fault,
// which every worker answers alike).
func (e *prefillError) retryable() bool {
	return e.Result != pdUnsupportedAPI && !(e.Result == pdStatus && e.Status >= 400 && e.Status < 500)
}

// remotePrefill runs f's prefill leg and returns the decode leg's body, or a
// *prefillError (the caller then sends body unchanged: local prefill) or the client's
// context error (the client went away: both legs are over). A failed leg is retried
// once on another prefill worker when the router's pair pick finds one worth it
// (router.Ticket.RetryPrefill), else the decode worker prefills. Each leg counts its
// result in kvroute_proxy_pd_prefill_legs_total, each failure what followed it (retry,
// fallback). It reports the leg's end to the ticket (PrefillDone, RetryPrefill) unless
// the client went away, which the caller's abort settles.
func (h *handler) remotePrefill(ctx context.Context, r *http.Request, f *flight, body []byte) ([]byte, error) {
	for {
		dbody, err := h.prefillLeg(ctx, r, f, body)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var pe *prefillError
		if !errors.As(err, &pe) {
			h.m.ProxyPrefillLegs.WithLabelValues("ok").Inc()
			f.Ticket.PrefillDone(nil)
			f.Route.Event("prefill_done", time.Time{})
			return dbody, nil
		}
		h.m.ProxyPrefillLegs.WithLabelValues(pe.Result).Inc()
		failed, addr := f.Ticket.PrefillWorker, f.Ticket.PrefillAddress
		if pe.Result == pdConnect && !h.opt.NoPassiveHealth {
			h.opt.Router.Registry().SetHealthy(failed, false)
		}
		if pe.retryable() && f.Ticket.RetryPrefill(ctx, f.req, err) {
			h.m.ProxyPrefillLegs.WithLabelValues(pdRetry).Inc()
			h.log.Warn("proxy: remote prefill failed, retrying on another prefill worker", "prefill_worker", failed,
				"prefill_address", addr, "retry_worker", f.Ticket.PrefillWorker, "decode_worker", f.Ticket.Worker, "result", pe.Result, "err", pe.Err)
			f.Route.Event("prefill_retry", time.Time{})
			continue
		}
		if !pe.retryable() {
			f.Ticket.PrefillDone(err)
		}
		h.m.ProxyPrefillLegs.WithLabelValues(pdFallback).Inc()
		h.log.Warn("proxy: remote prefill failed, prefilling on the decode worker", "prefill_worker", failed,
			"prefill_address", addr, "decode_worker", f.Ticket.Worker, "result", pe.Result, "err", pe.Err)
		f.Route.Event("prefill_done", time.Time{})
		return body, err
	}
}

// prefillLeg sends the prefill request and builds the decode body from its answer.
func (h *handler) prefillLeg(ctx context.Context, r *http.Request, f *flight, body []byte) ([]byte, error) {
	if f.req.API != request.APIChat && f.req.API != request.APICompletions {
		return nil, &prefillError{Result: pdUnsupportedAPI, Err: fmt.Errorf("%s has no kv_transfer_params", r.URL.Path)}
	}
	root, err := jsonvalue.ParseValueLimit(body, h.opt.Router.MaxPromptIDs())
	if err != nil || root.Kind() != jsonvalue.Object {
		return nil, &prefillError{Result: pdUnsupportedAPI, Err: fmt.Errorf("request body: %v", err)} // parsed before: not reached
	}
	null := jsonvalue.Value{}
	kv := jsonvalue.ObjectValue(
		jsonvalue.Member{Key: "do_remote_decode", Value: jsonvalue.BoolValue(true)},
		jsonvalue.Member{Key: "do_remote_prefill", Value: jsonvalue.BoolValue(false)},
		jsonvalue.Member{Key: "remote_engine_id", Value: null},
		jsonvalue.Member{Key: "remote_block_ids", Value: null},
		jsonvalue.Member{Key: "remote_host", Value: null},
		jsonvalue.Member{Key: "remote_port", Value: null})
	one := jsonvalue.NumberValue("1")
	set := []jsonvalue.Member{{Key: "kv_transfer_params", Value: kv}, {Key: "stream", Value: jsonvalue.BoolValue(false)},
		{Key: "max_tokens", Value: one}}
	if _, ok := root.Get("max_completion_tokens"); ok {
		set = append(set, jsonvalue.Member{Key: "max_completion_tokens", Value: one})
	}
	pbody := withMembers(root, set, "stream_options").AppendJSON(nil)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var timedOut atomic.Bool
	watchdog := time.AfterFunc(h.opt.Proxy.UpstreamHeaderTimeout, func() { timedOut.Store(true); cancel() })
	defer watchdog.Stop()
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+f.Ticket.PrefillAddress+r.URL.RequestURI(), bytes.NewReader(pbody))
	if err != nil {
		return nil, &prefillError{Result: pdConnect, Err: err}
	}
	h.legHeaders(out.Header, r.Header, f)
	out.Header.Set("Content-Type", "application/json")
	resp, err := h.opt.Transport.RoundTrip(out)
	if err != nil {
		if timedOut.Load() {
			return nil, &prefillError{Result: pdTimeout, Err: fmt.Errorf("no response within %s (proxy.upstream_header_timeout)", h.opt.Proxy.UpstreamHeaderTimeout)}
		}
		return nil, &prefillError{Result: pdConnect, Err: err}
	}
	defer resp.Body.Close()
	watchdog.Reset(h.opt.Proxy.UpstreamIdleTimeout)
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxPrefillResponseBytes+1))
	switch {
	case timedOut.Load():
		return nil, &prefillError{Result: pdTimeout, Err: fmt.Errorf("response body not read within %s (proxy.upstream_idle_timeout)", h.opt.Proxy.UpstreamIdleTimeout)}
	case err != nil:
		return nil, &prefillError{Result: pdBadResponse, Err: err}
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return nil, &prefillError{Result: pdStatus, Err: fmt.Errorf("status %d", resp.StatusCode), Status: resp.StatusCode}
	case len(raw) > maxPrefillResponseBytes:
		return nil, &prefillError{Result: pdBadResponse, Err: fmt.Errorf("response over %d bytes", maxPrefillResponseBytes)}
	}
	presp, err := jsonvalue.ParseValueLimit(raw, h.opt.Router.MaxPromptIDs())
	if err != nil {
		return nil, &prefillError{Result: pdBadResponse, Err: err}
	}
	params := presp.Field("kv_transfer_params")
	if params.Kind() != jsonvalue.Object {
		return nil, &prefillError{Result: pdNoKVParams, Err: fmt.Errorf("the response has %s kv_transfer_params (is the worker a kv_producer?)", params.Kind())}
	}
	// raw backs params' strings: the decode body is written out now, while it lives.
	return withMembers(root, []jsonvalue.Member{{Key: "kv_transfer_params", Value: params}}).AppendJSON(nil), nil
}

// legHeaders copies the client's end-to-end headers onto the prefill leg, less what
// kvroute strips from every upstream request (the tenant header, the classify tag),
// with kvroute's classify tags, the request id both legs share and the trace context.
func (h *handler) legHeaders(dst, src http.Header, f *flight) {
	for k, vs := range src {
		switch http.CanonicalHeaderKey(k) {
		case "Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
			"Content-Length", "Host", "Accept-Encoding":
			continue
		}
		dst[k] = append([]string(nil), vs...)
	}
	if th := h.opt.Admission.TenantHeader(); th != "" {
		dst.Del(th)
	}
	if h.opt.Classify != nil {
		dst.Del(classify.TagHeader)
		for _, kv := range f.tags {
			dst.Set(kv[0], kv[1])
		}
	}
	dst.Set("X-Request-Id", f.requestID)
	f.Route.Inject(dst.Set)
}

// pdRequestID is the X-Request-Id both legs carry: the client's, or a new one.
func pdRequestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" {
		return id
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "kvroute-pd-" + hex.EncodeToString(b[:])
}

// withMembers returns object v with the members of set replacing those of the same key
// in place (or appended, in order) and the keys in drop removed.
func withMembers(v jsonvalue.Value, set []jsonvalue.Member, drop ...string) jsonvalue.Value {
	old := v.Members()
	out := make([]jsonvalue.Member, 0, len(old)+len(set))
	done := make([]bool, len(set))
outer:
	for _, m := range old {
		for _, d := range drop {
			if m.Key == d {
				continue outer
			}
		}
		for i, s := range set {
			if m.Key == s.Key {
				if !done[i] {
					out, done[i] = append(out, s), true
				}
				continue outer
			}
		}
		out = append(out, m)
	}
	for i, s := range set {
		if !done[i] {
			out = append(out, s)
		}
	}
	return jsonvalue.ObjectValue(out...)
}

// withoutClientKVParams removes a client's kv_transfer_params from body
// (request.WithoutKVTransferParams), counted: only kvroute's own P/D exchange may set
// them.
func (h *handler) withoutClientKVParams(body []byte, api request.API) []byte {
	out, stripped := request.WithoutKVTransferParams(body, api, h.opt.Router.MaxPromptIDs())
	if stripped {
		h.m.ClientKVParams.WithLabelValues("proxy", "stripped").Inc()
	}
	return out
}
