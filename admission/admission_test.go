package admission

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/front"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/router"
)

// fixed is a clock in the middle of a minute, so that no window ends during a test.
func fixed() time.Time { return time.Date(2026, 1, 1, 12, 0, 30, 0, time.UTC) }

func newAdmitter(t *testing.T, mod func(*config.Admission)) (*Admitter, *metrics.Set) {
	t.Helper()
	c := config.Default().Admission
	if mod != nil {
		mod(&c)
	}
	cfg := config.Default()
	cfg.Admission = c
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ms := metrics.NewUnregistered()
	a, err := New(Options{Config: c, Metrics: ms, Now: fixed})
	if err != nil {
		t.Fatal(err)
	}
	return a, ms
}

func headers(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

func jwtMetadata(t *testing.T, claims map[string]any) map[string]*structpb.Struct {
	t.Helper()
	payload, err := structpb.NewStruct(map[string]any{"jwt_payload": claims})
	if err != nil {
		t.Fatal(err)
	}
	return map[string]*structpb.Struct{"envoy.filters.http.jwt_authn": payload}
}

func keyFile(t *testing.T, lines ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func hashHex(key string) string { h := sha256.Sum256([]byte(key)); return hex.EncodeToString(h[:]) }

// The verified claim in metadata wins over a tenant header, and a client header that
// imitates the claim (a forged x-jwt-sub, or the tenant header itself) is ignored when
// the only source is metadata.
func TestIdentityMetadataWinsAndForgedClaimIgnored(t *testing.T) {
	a, _ := newAdmitter(t, func(c *config.Admission) { c.Identity = []string{"metadata", "header"} })
	id, err := a.Identify(Input{Header: headers("x-kvroute-tenant", "edge-team"), EdgeHeaders: true,
		Metadata: jwtMetadata(t, map[string]any{"sub": "jwt-team", "iss": "x"})})
	if err != nil || id != (Identity{Tenant: "jwt-team", Source: "metadata"}) {
		t.Fatalf("metadata must win: %+v %v", id, err)
	}
	// No verified payload: the next source (edge header) yields.
	id, _ = a.Identify(Input{Header: headers("x-kvroute-tenant", "edge-team"), EdgeHeaders: true})
	if id.Tenant != "edge-team" || id.Source != "header" {
		t.Fatalf("header fallback: %+v", id)
	}

	only, _ := newAdmitter(t, func(c *config.Admission) { c.Identity = []string{"metadata"} })
	for _, h := range []func(string) string{
		headers("x-jwt-sub", "victim", "sub", "victim", "x-kvroute-tenant", "victim", "jwt_payload", `{"sub":"victim"}`),
	} {
		id, _ := only.Identify(Input{Header: h, EdgeHeaders: true, Metadata: jwtMetadata(t, map[string]any{"iss": "x"})})
		if id.Tenant != Unattributed {
			t.Fatalf("a forged claim header attributed %+v", id)
		}
	}
	// A claim in another namespace (not the verified jwt_authn one) does not count.
	id, _ = only.Identify(Input{Metadata: map[string]*structpb.Struct{"client.set": jwtMetadata(t, map[string]any{"sub": "victim"})["envoy.filters.http.jwt_authn"]}})
	if id.Tenant != Unattributed {
		t.Fatalf("claim from an unverified namespace: %+v", id)
	}
}

// In proxy (EdgeHeaders false) a tenant header counts only from trusted_peers; from any
// other peer it is ignored and counted.
func TestIdentityHeaderOnlyFromTrustedPeers(t *testing.T) {
	a, ms := newAdmitter(t, func(c *config.Admission) {
		c.Identity = []string{"header"}
		c.TrustedPeers = []string{"10.1.0.0/16", "::1"}
	})
	h := headers("x-kvroute-tenant", "victim")
	for _, peer := range []string{"127.0.0.1", "10.2.0.1", "::2"} {
		id, _ := a.Identify(Input{Header: h, Peer: netip.MustParseAddr(peer)})
		if id.Tenant != Unattributed {
			t.Fatalf("header from untrusted %s attributed %+v", peer, id)
		}
	}
	if id, _ := a.Identify(Input{Header: h}); id.Tenant != Unattributed {
		t.Fatalf("unknown peer attributed %+v", id)
	}
	if n := testutil.ToFloat64(ms.Admission.UntrustedIdentity.WithLabelValues("header")); n != 4 {
		t.Fatalf("untrusted headers counted %v, want 4", n)
	}
	for _, peer := range []string{"10.1.2.3", "::1", "::ffff:10.1.0.9"} {
		if id, _ := a.Identify(Input{Header: h, Peer: netip.MustParseAddr(peer)}); id.Tenant != "victim" {
			t.Fatalf("trusted %s: %+v", peer, id)
		}
	}
}

// API keys are looked up by SHA-256; an unknown key is counted and does not attribute;
// require_tenant answers 401 in the request's API shape.
func TestIdentityAPIKeysAndRequireTenant(t *testing.T) {
	path := keyFile(t, "# tenants", hashHex("sk-alpha")+" alpha", "", hashHex("sk-beta")+" beta")
	a, ms := newAdmitter(t, func(c *config.Admission) {
		c.Identity = []string{"api_key"}
		c.APIKeysFile = path
		c.RequireTenant = true
	})
	if id, err := a.Identify(Input{Header: headers("authorization", "Bearer sk-alpha")}); err != nil || id.Tenant != "alpha" {
		t.Fatalf("%+v %v", id, err)
	}
	if id, err := a.Identify(Input{Header: headers("x-api-key", "sk-beta")}); err != nil || id.Tenant != "beta" {
		t.Fatalf("%+v %v", id, err)
	}
	_, err := a.Identify(Input{Header: headers("authorization", "Bearer sk-wrong")})
	var re *router.Error
	if !errors.As(err, &re) || re.Status != http.StatusUnauthorized {
		t.Fatalf("want 401, got %v", err)
	}
	rep := front.ErrorReply(request.APIMessages, err)
	if rep.Status != 401 || !strings.Contains(string(rep.Body), `"type":"authentication_error"`) || strings.Contains(string(rep.Body), "sk-wrong") {
		t.Fatalf("%d %s", rep.Status, rep.Body)
	}
	if testutil.ToFloat64(ms.Admission.UntrustedIdentity.WithLabelValues("api_key")) != 1 ||
		testutil.ToFloat64(ms.Admission.Refused.WithLabelValues(Unattributed, "default", "unauthenticated")) != 1 {
		t.Fatal("unknown key / 401 not counted")
	}
}

func TestLoadKeysErrors(t *testing.T) {
	for name, line := range map[string]string{
		"one field": hashHex("k"),
		"not hex":   strings.Repeat("z", 64) + " t",
		"short":     "abcd t",
		"bad name":  hashHex("k") + " \x01",
		"dup":       hashHex("k") + " a\n" + hashHex("k") + " b",
	} {
		_, err := LoadKeys(keyFile(t, line))
		if err == nil {
			t.Fatalf("%s: accepted", name)
		}
		if strings.Contains(err.Error(), hashHex("k")) {
			t.Fatalf("%s: error shows the key hash: %v", name, err)
		}
	}
	if _, err := LoadKeys(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("missing file accepted")
	}
}

// 200 concurrent reservations against a budget of exactly K tokens admit exactly
// K/cost of them: no overrun, no lost tokens; settling each for its reservation
// leaves the window at exactly the admitted cost, and concurrency at 0.
func TestExactBudgetUnderConcurrency(t *testing.T) {
	const per, fit = 150, 37 // cost per request: 100 prompt (40 cached) + 50 output
	a, ms := newAdmitter(t, func(c *config.Admission) {
		c.Tenants = []config.TenantLimits{{Name: "acme", Limits: config.Limits{TokensPerMinute: per * fit}}}
	})
	id := Identity{Tenant: "acme", Source: "header"}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		grants  []*Grant
		refused int
	)
	start := make(chan struct{})
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			g, err := a.Reserve(id, Want{PromptTokens: 100, CachedTokens: 40, MaxTokens: 50})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				var re *router.Error
				if !errors.As(err, &re) || re.Status != 429 {
					t.Errorf("refusal %v", err)
				}
				refused++
				return
			}
			grants = append(grants, g)
		}()
	}
	close(start)
	wg.Wait()
	if len(grants) != fit || refused != 200-fit {
		t.Fatalf("admitted %d refused %d, want %d and %d", len(grants), refused, fit, 200-fit)
	}
	st := a.Snapshot()[0]
	if st.WindowTokens != per*fit || st.Concurrent != fit || st.WindowRequests != fit {
		t.Fatalf("state after reserve %+v", st)
	}
	var swg sync.WaitGroup
	for _, g := range grants {
		swg.Add(1)
		go func() {
			defer swg.Done()
			u := response.Usage{Present: true, PromptTokens: 100, CompletionTokens: 50, CachedTokens: 40, CachedReported: true}
			g.Settle(response.Result{Status: 200, Usage: u, Outcome: response.OutcomeOK}, -1)
			g.Settle(response.Result{Status: 200, Usage: u, Outcome: response.OutcomeOK}, -1) // once only
			g.Release()
		}()
	}
	swg.Wait()
	st = a.Snapshot()[0]
	if st.WindowTokens != per*fit || st.Concurrent != 0 {
		t.Fatalf("state after settle %+v", st)
	}
	if n := testutil.ToFloat64(ms.Admission.Requests.WithLabelValues("acme", "default", "ok")); n != fit {
		t.Fatalf("settled %v requests, want %d", n, fit)
	}
	if n := testutil.ToFloat64(ms.Admission.Refused.WithLabelValues("acme", "default", "tokens")); n != 200-fit {
		t.Fatalf("refusals counted %v", n)
	}
}

// A refusal is a 429 with Retry-After (until the window ends) and OpenAI's
// x-ratelimit-* headers; on /v1/messages the body is Anthropic's error shape.
func TestRefusalHeaders(t *testing.T) {
	a, _ := newAdmitter(t, func(c *config.Admission) {
		c.Default = config.Limits{TokensPerMinute: 1000, RequestsPerMinute: 5}
	})
	id := Identity{Tenant: Unattributed, Source: "none"}
	if _, err := a.Reserve(id, Want{PromptTokens: 600, MaxTokens: 100}); err != nil {
		t.Fatal(err)
	}
	_, err := a.Reserve(id, Want{PromptTokens: 600, MaxTokens: 100})
	rep := front.ErrorReply(request.APIChat, err)
	h := map[string]string{}
	for _, kv := range rep.Header {
		h[kv[0]] = kv[1]
	}
	want := map[string]string{"retry-after": "30", "x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "300",
		"x-ratelimit-reset-tokens": "30s", "x-ratelimit-limit-requests": "5", "x-ratelimit-remaining-requests": "4", "x-ratelimit-reset-requests": "30s"}
	for k, v := range want {
		if h[k] != v {
			t.Fatalf("%s = %q, want %q (all %v)", k, h[k], v, h)
		}
	}
	if rep.Status != 429 || !strings.Contains(string(rep.Body), `"type":"rate_limit_exceeded"`) {
		t.Fatalf("%d %s", rep.Status, rep.Body)
	}
	if m := front.ErrorReply(request.APIMessages, err); !strings.HasPrefix(string(m.Body), `{"type":"error","error":{"type":"rate_limit_error"`) {
		t.Fatalf("anthropic shape: %s", m.Body)
	}
}

// rejectedReason is the x-kvroute-rejected-reason of err's reply ("" when none).
func rejectedReason(err error) string {
	for _, h := range front.ErrorReply(request.APIChat, err).Header {
		if h[0] == RejectedReasonHeader {
			return h[1]
		}
	}
	return ""
}

// Requests per minute and concurrency are limits of their own, each refusal naming
// its limit in x-kvroute-rejected-reason.
func TestRequestAndConcurrencyLimits(t *testing.T) {
	a, ms := newAdmitter(t, func(c *config.Admission) { c.Default = config.Limits{RequestsPerMinute: 3, MaxConcurrent: 2} })
	id := Identity{Tenant: Unattributed}
	g1, _ := a.Reserve(id, Want{})
	g2, _ := a.Reserve(id, Want{})
	if _, err := a.Reserve(id, Want{}); err == nil {
		t.Fatal("third concurrent admitted")
	} else if got := rejectedReason(err); got != "concurrency_limit" {
		t.Fatalf("concurrency refusal: x-kvroute-rejected-reason %q", got)
	}
	g1.Settle(response.Result{Outcome: response.OutcomeOK}, 0)
	if _, err := a.Reserve(id, Want{}); err != nil {
		t.Fatalf("slot freed: %v", err)
	}
	g2.Release()
	_, err := a.Reserve(id, Want{})
	var re *router.Error
	if !errors.As(err, &re) || !strings.Contains(re.Details, "requests") || rejectedReason(err) != "request_budget" {
		t.Fatalf("fourth in the minute: %v (x-kvroute-rejected-reason %q)", err, rejectedReason(err))
	}
	if testutil.ToFloat64(ms.Admission.Refused.WithLabelValues(Unattributed, "default", "concurrency")) != 1 ||
		testutil.ToFloat64(ms.Admission.Refused.WithLabelValues(Unattributed, "default", "requests")) != 1 {
		t.Fatal("reasons not counted")
	}
}

// Settlement replaces the reservation with the actual cost by usage source, weighted;
// an aborted request pays its prompt and what was streamed; a new window starts empty.
func TestSettlementSources(t *testing.T) {
	now := fixed()
	c := config.Default().Admission
	c.Weights = config.CostWeights{Uncached: 1, Cached: 0.1, Output: 2}
	c.DefaultOutputTokens = 100
	ms := metrics.NewUnregistered()
	a, err := New(Options{Config: c, Metrics: ms, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	id := Identity{Tenant: "t"}
	want := Want{PromptTokens: 1000, CachedTokens: 500, MaxTokens: 0}
	tokens := func() int64 { return a.Snapshot()[0].WindowTokens }
	g, _ := a.Reserve(id, want)
	if g.Reserved() != 500+50+200 || tokens() != 750 {
		t.Fatalf("reserved %d (window %d), want 750", g.Reserved(), tokens())
	}
	// reported: 1000 prompt, 800 cached, 10 output → 200 + 80 + 20 = 300
	g.Settle(response.Result{Usage: response.Usage{Present: true, PromptTokens: 1000, CachedTokens: 800, CachedReported: true, CompletionTokens: 10}, Outcome: response.OutcomeOK}, 99)
	if tokens() != 300 {
		t.Fatalf("reported: window %d, want 300", tokens())
	}
	// counted (aborted mid-stream after 7 content events): 500 + 50 + 14
	g, _ = a.Reserve(id, want)
	g.Settle(response.Result{Outcome: response.OutcomeAborted}, 7)
	if tokens() != 300+564 {
		t.Fatalf("counted: window %d", tokens())
	}
	// estimated: the reservation stands
	g, _ = a.Reserve(id, want)
	g.Settle(response.Result{Outcome: response.OutcomeOK}, -1)
	if tokens() != 300+564+750 {
		t.Fatalf("estimated: window %d", tokens())
	}
	for src, n := range map[string]float64{"reported": 1, "counted": 1, "estimated": 1} {
		if testutil.ToFloat64(ms.Admission.Settlements.WithLabelValues(src)) != n {
			t.Fatalf("usage_source %s not counted", src)
		}
	}
	if testutil.ToFloat64(ms.Admission.TokensSettled.WithLabelValues("t", "default", "output")) != 10+7+100 {
		t.Fatal("settled output tokens")
	}
	// Reserved in one window, settled in the next: an overrun is charged to the new
	// window, a refund is void.
	g1, _ := a.Reserve(id, want)
	g2, _ := a.Reserve(id, want)
	now = now.Add(time.Minute)
	g1.Settle(response.Result{Outcome: response.OutcomeOK}, 400) // 500+50+800 = 1350: +600
	g2.Settle(response.Result{Outcome: response.OutcomeOK}, 0)   // refund, void
	if tokens() != 600 {
		t.Fatalf("next window: %d, want 600", tokens())
	}
}

// The default cap is written once (config.DefaultMetricsMaxTenants) and docs/metrics.md
// states the same number.
func TestMetricsMaxTenantsDefaultDocumented(t *testing.T) {
	raw, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("`admission.metrics_max_tenants`, default \\*\\*(\\d+)\\*\\*").FindSubmatch(raw)
	if m == nil {
		t.Fatal("docs/metrics.md does not state admission.metrics_max_tenants' default as \"`admission.metrics_max_tenants`, default **N**\"")
	}
	if string(m[1]) != strconv.Itoa(config.Default().Admission.MetricsMaxTenants) || config.Default().Admission.MetricsMaxTenants != config.DefaultMetricsMaxTenants {
		t.Fatalf("docs say %s, code %d", m[1], config.Default().Admission.MetricsMaxTenants)
	}
}

// A nil Admitter admits everything as unattributed.
func TestNilAdmitter(t *testing.T) {
	var a *Admitter
	id, err := a.Identify(Input{Header: headers("x-kvroute-tenant", "x")})
	g, err2 := a.Reserve(id, Want{PromptTokens: 1e9})
	if err != nil || err2 != nil || id.Tenant != Unattributed || g != nil {
		t.Fatal(id, err, err2)
	}
	g.Settle(response.Result{}, 1)
	g.Release()
}

// Every budget refusal names its limit in x-kvroute-rejected-reason, the 503 of a
// fail_closed budget backend too.
func TestBudgetRefusalReasons(t *testing.T) {
	for reason, want := range map[string]string{"tokens": "token_budget", "requests": "request_budget",
		"concurrency": "concurrency_limit", "unavailable": "budget_unavailable"} {
		if got := rejectedReason(refusalError(&Refusal{Reason: reason, TokenLimit: 10, Reset: time.Second}, 20)); got != want {
			t.Errorf("%s: x-kvroute-rejected-reason %q, want %q", reason, got, want)
		}
	}
}
