package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/workers"
)

// sseWorker streams three content events and usage only when asked for.
func sseWorker() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, tok := range []string{"a", "b", "c"} {
			io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":"`+tok+`"}}]}`+"\n\n")
		}
		io.WriteString(w, `data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n")
		if strings.Contains(string(body), `"include_usage":true`) {
			io.WriteString(w, `data: {"choices":[],"usage":{"prompt_tokens":11,"completion_tokens":3}}`+"\n\n")
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
}

// admissionProxy is the real proxy on a loopback listener, with an admission stage.
func admissionProxy(t *testing.T, mod func(*config.Admission)) (*httptest.Server, *admission.Admitter, *metrics.Set) {
	t.Helper()
	up := httptest.NewServer(sseWorker())
	t.Cleanup(up.Close)
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "w", Address: strings.TrimPrefix(up.URL, "http://"), Models: []string{"m"}}})
	ms := metrics.NewUnregistered()
	r := router.New(router.Options{Registry: reg, Models: []router.Model{{Name: "m"}}, Metrics: ms})
	c := config.Default().Admission
	mod(&c)
	adm, err := admission.New(admission.Options{Config: c, Metrics: ms, Now: midMinute})
	if err != nil {
		t.Fatal(err)
	}
	px := config.Default().Proxy
	px.Paths = append(px.Paths, "/v1/messages") // an Anthropic journey below (not a default path)
	// These tests pin settlement of streams that carry no usage, so kvroute must not ask
	// for it (TestIncludeUsageInjectedAndStripped covers the default).
	px.InjectIncludeUsage = false
	srv := httptest.NewServer(New(Options{Router: r, Config: config.Default().ExtProc, Proxy: px, Metrics: ms, Admission: adm}))
	t.Cleanup(srv.Close)
	return srv, adm, ms
}

// midMinute is a fixed clock in the middle of a minute: no budget window ends during a
// test, whatever the machine's speed.
func midMinute() time.Time { return time.Date(2026, 1, 1, 12, 0, 30, 0, time.UTC) }

func admPost(t *testing.T, url, body string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

func tenants(adm *admission.Admitter) map[string]admission.TenantState {
	out := map[string]admission.TenantState{}
	for _, s := range adm.Snapshot() {
		out[s.Tenant] = s
	}
	return out
}

const chatBody = `{"model":"m","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hello"}]}`

// A client on loopback, not in trusted_peers, sets the tenant header: its usage is
// never attributed to that tenant (it is unattributed, and the attempt is counted);
// the same header from a trusted peer attributes.
func TestSpoofedTenantHeaderFromUntrustedPeerNotAttributed(t *testing.T) {
	srv, adm, ms := admissionProxy(t, func(c *config.Admission) {
		c.Identity = []string{"header"}
		c.TrustedPeers = []string{"10.0.0.0/8"} // not loopback
	})
	for range 3 {
		resp, body := admPost(t, srv.URL+"/v1/chat/completions", chatBody, map[string]string{"X-Kvroute-Tenant": "victim"})
		if resp.StatusCode != 200 || !strings.Contains(body, "[DONE]") {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	ts := tenants(adm)
	if _, ok := ts["victim"]; ok {
		t.Fatalf("spoofed tenant attributed: %+v", ts)
	}
	if ts[admission.Unattributed].WindowRequests != 3 || ts[admission.Unattributed].Concurrent != 0 {
		t.Fatalf("unattributed state %+v", ts[admission.Unattributed])
	}
	if testutil.ToFloat64(ms.Admission.UntrustedIdentity.WithLabelValues("header")) != 3 ||
		testutil.ToFloat64(ms.Admission.Requests.WithLabelValues("victim", "default", "ok")) != 0 ||
		testutil.ToFloat64(ms.Admission.Requests.WithLabelValues(admission.Unattributed, "default", "ok")) != 3 {
		t.Fatal("untrusted header not counted, or usage attributed to the spoofed tenant")
	}
	// No token budget: the stream is not counted (no per-event decode), the estimate stands.
	if testutil.ToFloat64(ms.Admission.Settlements.WithLabelValues("estimated")) != 3 {
		t.Fatal("settlement without usage or token budget must be estimated")
	}

	trusted, adm2, _ := admissionProxy(t, func(c *config.Admission) {
		c.Identity = []string{"header"}
		c.TrustedPeers = []string{"127.0.0.0/8", "::1"}
	})
	admPost(t, trusted.URL+"/v1/chat/completions", chatBody, map[string]string{"X-Kvroute-Tenant": "edge-set"})
	if tenants(adm2)["edge-set"].WindowRequests != 1 {
		t.Fatalf("trusted peer's header not believed: %+v", adm2.Snapshot())
	}
}

// Through the proxy: a stream without usage settles on the counted content events, one
// with usage on the usage; a tenant over its budget gets 429 with x-ratelimit-* headers,
// in Anthropic's shape on /v1/messages.
func TestProxyBudgetSettleAndRefuse(t *testing.T) {
	keys := apiKeyFile(t, "sk-a", "alpha")
	srv, adm, ms := admissionProxy(t, func(c *config.Admission) {
		c.Identity = []string{"api_key"}
		c.APIKeysFile = keys
		c.RequireTenant = true
		c.Tenants = []config.TenantLimits{{Name: "alpha", Limits: config.Limits{TokensPerMinute: 1000}}}
	})
	auth := map[string]string{"Authorization": "Bearer sk-a"}
	if resp, body := admPost(t, srv.URL+"/v1/chat/completions", chatBody, nil); resp.StatusCode != 401 {
		t.Fatalf("no key: %d %s", resp.StatusCode, body)
	}
	resp, _ := admPost(t, srv.URL+"/v1/chat/completions", chatBody, auth)
	if resp.StatusCode != 200 {
		t.Fatal(resp.StatusCode)
	}
	// The proxy's router has no tokenizer (GivenOnly): the prompt is 0 tokens; the
	// stream had 3 content events and no usage → 3 tokens settled.
	if st := tenants(adm)["alpha"]; st.WindowTokens != 3 || st.Concurrent != 0 {
		t.Fatalf("counted settlement: %+v", st)
	}
	withUsage := strings.Replace(chatBody, `"stream":true`, `"stream":true,"stream_options":{"include_usage":true}`, 1)
	admPost(t, srv.URL+"/v1/chat/completions", withUsage, auth)
	if st := tenants(adm)["alpha"]; st.WindowTokens != 3+11+3 {
		t.Fatalf("reported settlement: %+v", st)
	}
	if testutil.ToFloat64(ms.Admission.Settlements.WithLabelValues("counted")) != 1 || testutil.ToFloat64(ms.Admission.Settlements.WithLabelValues("reported")) != 1 {
		t.Fatal("usage_source not counted")
	}
	big := `{"model":"m","max_tokens":5000,"messages":[{"role":"user","content":"x"}]}`
	resp, body := admPost(t, srv.URL+"/v1/messages", big, map[string]string{"x-api-key": "sk-a"})
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || resp.Header.Get("X-Ratelimit-Limit-Tokens") != "1000" ||
		resp.Header.Get("X-Kvroute-Rejected-Reason") != "token_budget" ||
		resp.Header.Get("X-Ratelimit-Remaining-Tokens") != "983" || !strings.HasPrefix(body, `{"type":"error","error":{"type":"rate_limit_error"`) {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
	}
	if st := tenants(adm)["alpha"]; st.Concurrent != 0 || st.WindowTokens != 17 {
		t.Fatalf("a refusal changed the budget: %+v", st)
	}
	if testutil.ToFloat64(ms.Router.TicketsReleased.WithLabelValues("abort")) != 1 {
		t.Fatal("the refused request's ticket was not released")
	}
}

func writeFile(p, s string) error { return os.WriteFile(p, []byte(s), 0o600) }

// The tenant header is kvroute's input only: neither a client's forged copy nor a
// trusted edge's reaches the worker (something behind it could trust it).
func TestTenantHeaderNotForwarded(t *testing.T) {
	seen := make(chan string, 4)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("X-Kvroute-Tenant")
		sseWorker().ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "w", Address: strings.TrimPrefix(up.URL, "http://"), Models: []string{"m"}}})
	ms := metrics.NewUnregistered()
	r := router.New(router.Options{Registry: reg, Models: []router.Model{{Name: "m"}}, Metrics: ms})
	for _, trusted := range []string{"10.0.0.0/8", "127.0.0.0/8"} {
		c := config.Default().Admission
		c.Identity, c.TrustedPeers = []string{"header"}, []string{trusted, "::1/128"}
		adm, err := admission.New(admission.Options{Config: c, Metrics: ms, Now: midMinute})
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range []*admission.Admitter{adm, nil} {
			srv := httptest.NewServer(New(Options{Router: r, Config: config.Default().ExtProc, Metrics: ms, Admission: a}))
			resp, body := admPost(t, srv.URL+"/v1/chat/completions", chatBody, map[string]string{"X-Kvroute-Tenant": "forged"})
			srv.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			if got := <-seen; got != "" {
				t.Fatalf("trusted %s, admission %v: the worker received x-kvroute-tenant %q", trusted, a != nil, got)
			}
		}
	}
}
