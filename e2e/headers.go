package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// headerList is an ordered HTTP header map as Envoy keeps it: lower-case keys,
// pseudo-headers first, repeated headers as repeated entries.
type headerList [][2]string

// hopByHop are removed from requests by the HCM before any filter runs (CMU
// mutateRequestHeaders), so the processor never sees them.
var hopByHop = map[string]bool{"connection": true, "keep-alive": true, "proxy-connection": true,
	"transfer-encoding": true, "upgrade": true, "te": true}

// requestHeaders serializes r as Envoy sends it to the processor (SVC HttpHeaders; MU
// headersToProto): :method, :scheme, :authority (HTTP/1 Host), :path, then the rest
// lower-cased; hop-by-hop headers already gone; x-request-id generated when absent.
func requestHeaders(r *http.Request, requestID string) headerList {
	h := headerList{{":method", r.Method}, {":scheme", "http"}, {":authority", r.Host}, {":path", r.URL.RequestURI()}}
	for k, vs := range r.Header {
		lk := strings.ToLower(k)
		if hopByHop[lk] {
			continue
		}
		for _, v := range vs {
			h = append(h, [2]string{lk, v})
		}
	}
	if r.ContentLength > 0 && h.get("content-length") == "" {
		h = append(h, [2]string{"content-length", strconv.FormatInt(r.ContentLength, 10)})
	}
	if h.get("x-request-id") == "" {
		h = append(h, [2]string{"x-request-id", requestID})
	}
	return h
}

// responseHeaders serializes an upstream response: :status then lower-cased headers.
func responseHeaders(resp *http.Response) headerList {
	h := headerList{{":status", strconv.Itoa(resp.StatusCode)}}
	for k, vs := range resp.Header {
		for _, v := range vs {
			h = append(h, [2]string{strings.ToLower(k), v})
		}
	}
	return h
}

func (h headerList) get(k string) string {
	for _, kv := range h {
		if kv[0] == k {
			return kv[1]
		}
	}
	return ""
}

// has reports whether header k is present, whatever its value (route present_match).
func (h headerList) has(k string) bool {
	for _, kv := range h {
		if kv[0] == k {
			return true
		}
	}
	return false
}

func (h headerList) del(k string) headerList {
	out := h[:0]
	for _, kv := range h {
		if kv[0] != k {
			out = append(out, kv)
		}
	}
	return out
}

// proto renders h with values in raw_value only (send_header_raw_value, on by default
// since 2023: MU; SVC).
func (h headerList) proto() *corev3.HeaderMap {
	m := &corev3.HeaderMap{Headers: make([]*corev3.HeaderValue, len(h))}
	for i, kv := range h {
		m.Headers[i] = &corev3.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])}
	}
	return m
}

// errMutation is an invalid mutation: Envoy answers 500 (reference §3.7).
var errMutation = errors.New("invalid header mutation")

// apply applies m with Envoy's default HeaderMutationRules (MR): removes first, then
// sets in order (MU). Silently ignored (counter rejected_header_mutations): setting or
// removing host, :authority, :scheme, :method (need allow_all_routing) or x-envoy-*
// (need allow_envoy); removing any pseudo-header; appending to a pseudo-header;
// :status below 200; content-length when the body mode drops it (PS
// shouldRemoveContentLength, MU remove_content_length). Errors (→ 500): both value and
// raw_value set (semantic-router #253), CR/LF/NUL in a name or value. A value given
// only in `value` becomes empty (envoyproxy/envoy#31555). append=false overwrites every
// entry; append_action is ignored (envoyproxy/envoy#36982).
func (h headerList) apply(m *extprocv3.HeaderMutation, dropContentLength bool, rejected *int) (headerList, error) {
	if m == nil {
		return h, nil
	}
	if len(m.GetSetHeaders())+len(m.GetRemoveHeaders()) > 100 {
		return h, fmt.Errorf("%w: too many entries", errMutation)
	}
	for _, k := range m.GetRemoveHeaders() {
		k = strings.ToLower(k)
		if strings.HasPrefix(k, ":") || k == "host" || !allowed(k) {
			*rejected++
			continue
		}
		h = h.del(k)
	}
	for _, o := range m.GetSetHeaders() {
		hv := o.GetHeader()
		k := strings.ToLower(hv.GetKey())
		if hv.GetValue() != "" && len(hv.GetRawValue()) > 0 {
			return h, fmt.Errorf("%w: both value and raw_value set for %q", errMutation, k)
		}
		v := string(hv.GetRawValue())
		if strings.ContainsAny(k, "\r\n\x00") || strings.ContainsAny(v, "\r\n\x00") || k == "" {
			return h, fmt.Errorf("%w: invalid characters in %q", errMutation, k)
		}
		if !allowed(k) || (k == "content-length" && dropContentLength) {
			*rejected++
			continue
		}
		if k == ":status" {
			if s, err := strconv.Atoi(v); err != nil || s < 200 {
				*rejected++
				continue
			}
		}
		if o.GetAppend().GetValue() {
			if strings.HasPrefix(k, ":") {
				*rejected++
				continue
			}
			h = append(h, [2]string{k, v})
			continue
		}
		h = h.del(k)
		h = append(h, [2]string{k, v})
	}
	return h, nil
}

func allowed(k string) bool {
	switch k {
	case "host", ":authority", ":scheme", ":method":
		return false
	}
	return !strings.HasPrefix(k, "x-envoy-")
}
