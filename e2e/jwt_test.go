package e2e

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"slices"
	"testing"
	"time"

	extprocfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	jwtv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/envoy"
)

// Tenant identity through Envoy's jwt_authn, with the stand-in configured as
// envoy/envoy-jwt.yaml (issue 14 §1): the file's provider (issuer, audiences,
// payload_in_metadata, forward, require_expiration), its early header strip and its
// ext_proc forwarding_namespaces are read from the file; only the JWKS is the test's
// own key (the file names /etc/envoy/jwks.json).

// signer is an RSA key that signs RS256 tokens and publishes its JWKS.
type signer struct {
	key *rsa.PrivateKey
	kid string
}

func newSigner(t *testing.T, kid string) *signer {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return &signer{key: k, kid: kid}
}

func (s *signer) jwks() []byte {
	b64 := base64.RawURLEncoding.EncodeToString
	doc, _ := json.Marshal(map[string]any{"keys": []any{map[string]any{"kty": "RSA", "kid": s.kid, "alg": "RS256", "use": "sig",
		"n": b64(s.key.N.Bytes()), "e": b64(big.NewInt(int64(s.key.E)).Bytes())}}})
	return doc
}

func (s *signer) token(t *testing.T, claims map[string]any) string {
	t.Helper()
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	in := enc(map[string]any{"alg": "RS256", "typ": "JWT", "kid": s.kid}) + "." + enc(claims)
	d := sha256.Sum256([]byte(in))
	sig, err := rsa.SignPKCS1v15(rand.Reader, s.key, crypto.SHA256, d[:])
	if err != nil {
		t.Fatal(err)
	}
	return in + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// jwtShipped is the stand-in configured from envoy/envoy-jwt.yaml, verifying with jwks.
func jwtShipped(t *testing.T, jwks []byte) Config {
	t.Helper()
	c := shippedConfig(t, "envoy-jwt.yaml")
	b, err := envoy.LoadBootstrap("../envoy/envoy-jwt.yaml")
	if err != nil {
		t.Fatal(err)
	}
	err = envoy.Walk(b, func(m proto.Message, _ bool) error {
		switch x := m.(type) {
		case *jwtv3.JwtAuthentication:
			for _, p := range x.GetProviders() {
				c.JWT = &JWTAuthn{Issuer: p.GetIssuer(), Audiences: p.GetAudiences(), JWKS: jwks,
					PayloadInMetadata: p.GetPayloadInMetadata(), Forward: p.GetForward(), RequireExpiration: p.GetRequireExpiration()}
			}
		case *extprocfv3.ExternalProcessor:
			c.ForwardingNamespaces = x.GetMetadataOptions().GetForwardingNamespaces().GetUntyped()
		}
		return nil
	})
	if err != nil || c.JWT == nil {
		t.Fatalf("no jwt_authn provider in envoy-jwt.yaml (%v)", err)
	}
	return c
}

// claimsFor are valid claims of the shipped provider for subject sub.
func claimsFor(c Config, sub string) map[string]any {
	return map[string]any{"iss": c.JWT.Issuer, "aud": c.JWT.Audiences[0], "sub": sub, "exp": time.Now().Add(time.Hour).Unix()}
}

func tenantRequests(f *fixture, tenant string) float64 {
	var n float64
	for _, o := range []string{"ok", "client_error", "upstream_error", "error_event", "truncated", "aborted", "expired", "rejected"} {
		n += testutil.ToFloat64(f.app.Metrics.Admission.Requests.WithLabelValues(tenant, "default", o))
	}
	return n
}

func admissionCfg(identity ...string) func(*config.Config) {
	return func(c *config.Config) { c.Admission.Identity = identity }
}

// A verified token names the tenant; the client's tenant header and any header that
// looks like a claim are ignored; neither the token nor the tenant header reaches the
// worker.
func TestJWTTenantFromVerifiedClaim(t *testing.T) {
	s := newSigner(t, "k1")
	ec := jwtShipped(t, s.jwks())
	f := newFixture(t, fixtureOpts{envoy: ec, cfg: admissionCfg("metadata", "header")})
	tok := s.token(t, claimsFor(ec, "team-a"))
	st, _, body := f.do("POST", "/v1/chat/completions", chatNonStream, "Authorization", "Bearer "+tok,
		"x-kvroute-tenant", "team-b", "x-jwt-payload", `{"sub":"team-b"}`, "sub", "team-b")
	if st != 200 {
		t.Fatalf("status %d: %s", st, body)
	}
	// A streamed request: the tenant's TTFT is observed at its first token.
	if st, _, body := f.do("POST", "/v1/chat/completions", chatStream, "Authorization", "Bearer "+tok); st != 200 {
		t.Fatalf("status %d: %s", st, body)
	}
	f.waitInFlight(0)
	if got := tenantRequests(f, "team-a"); got != 2 {
		t.Fatalf("team-a requests %v, want 2 (the verified claim)", got)
	}
	if n := testutil.CollectAndCount(f.app.Metrics.Admission.TTFT, "kvroute_admission_time_to_first_token_seconds"); n != 1 {
		t.Fatalf("per-tenant TTFT children %d, want 1 (team-a)", n)
	}
	if tenantRequests(f, "team-b")+tenantRequests(f, admission.Unattributed) != 0 {
		t.Fatal("the client's header attributed the request")
	}
	for _, w := range f.workers {
		if h, _ := w.last(); h != nil {
			if h.Get("Authorization") != "" || h.Get("X-Kvroute-Tenant") != "" {
				t.Fatalf("the worker saw the token or the tenant header: %v", h)
			}
		}
	}
}

// Envoy answers a missing, foreign-signed, expired or wrong-audience token with 401
// before ext_proc: kvroute sees nothing, no worker is reached.
func TestJWTRefusedBeforeKvroute(t *testing.T) {
	s, other := newSigner(t, "k1"), newSigner(t, "k1")
	ec := jwtShipped(t, s.jwks())
	f := newFixture(t, fixtureOpts{envoy: ec, cfg: admissionCfg("metadata")})
	expired := claimsFor(ec, "team-a")
	expired["exp"] = time.Now().Add(-time.Minute).Unix()
	noExp := claimsFor(ec, "team-a")
	delete(noExp, "exp")
	wrongAud := claimsFor(ec, "team-a")
	wrongAud["aud"] = "someone-else"
	wrongIss := claimsFor(ec, "team-a")
	wrongIss["iss"] = "https://evil.example"
	for name, hdr := range map[string][]string{
		"missing":        nil,
		"not bearer":     {"Authorization", "Basic dXNlcjpwYXNz"},
		"foreign key":    {"Authorization", "Bearer " + other.token(t, claimsFor(ec, "team-a"))},
		"expired":        {"Authorization", "Bearer " + s.token(t, expired)},
		"no exp":         {"Authorization", "Bearer " + s.token(t, noExp)},
		"wrong audience": {"Authorization", "Bearer " + s.token(t, wrongAud)},
		"wrong issuer":   {"Authorization", "Bearer " + s.token(t, wrongIss)},
		"garbage":        {"Authorization", "Bearer a.b.c"},
	} {
		before := f.envoy.Stats().Messages
		st, h, body := f.do("POST", "/v1/chat/completions", chatNonStream, append(hdr, "x-kvroute-tenant", "team-b")...)
		if st != 401 || h.Get("Www-Authenticate") == "" {
			t.Errorf("%s: status %d %q, want Envoy's 401 with www-authenticate", name, st, body)
		}
		if f.envoy.Stats().Messages != before {
			t.Errorf("%s: ext_proc saw the request", name)
		}
	}
	if f.workers[0].hits.Load()+f.workers[1].hits.Load() != 0 {
		t.Fatal("a request without a valid token reached a worker")
	}
}

// With the claim as the only identity source, a request that carries no verified
// payload (a provider with allow_missing) is unattributed whatever headers it forges,
// even with the edge strip removed so that they reach kvroute.
func TestJWTForgedClaimHeaderIgnored(t *testing.T) {
	s := newSigner(t, "k1")
	ec := jwtShipped(t, s.jwks())
	ec.JWT.AllowMissing = true
	ec.StripHeaders = slices.DeleteFunc(slices.Clone(ec.StripHeaders), func(h string) bool { return h == "x-kvroute-tenant" })
	f := newFixture(t, fixtureOpts{envoy: ec, cfg: admissionCfg("metadata")})
	st, _, body := f.do("POST", "/v1/chat/completions", chatNonStream, "x-kvroute-tenant", "victim",
		"x-jwt-payload", `{"sub":"victim"}`, "jwt_payload", `{"sub":"victim"}`, "sub", "victim")
	if st != 200 {
		t.Fatalf("status %d: %s", st, body)
	}
	if tenantRequests(f, "victim") != 0 || tenantRequests(f, admission.Unattributed) != 1 {
		t.Fatalf("victim %v, unattributed %v: a forged header named the tenant", tenantRequests(f, "victim"), tenantRequests(f, admission.Unattributed))
	}
}

// identity [metadata, header]: the verified claim wins over a tenant header that
// reached kvroute (an edge filter's, here the client's with the strip removed); without
// a token the header source applies.
func TestJWTMetadataWinsOverHeader(t *testing.T) {
	s := newSigner(t, "k1")
	ec := jwtShipped(t, s.jwks())
	ec.JWT.AllowMissing = true
	ec.StripHeaders = slices.DeleteFunc(slices.Clone(ec.StripHeaders), func(h string) bool { return h == "x-kvroute-tenant" })
	f := newFixture(t, fixtureOpts{envoy: ec, cfg: admissionCfg("metadata", "header")})
	tok := s.token(t, claimsFor(ec, "team-a"))
	if st, _, body := f.do("POST", "/v1/chat/completions", chatNonStream, "Authorization", "Bearer "+tok, "x-kvroute-tenant", "edge-team"); st != 200 {
		t.Fatalf("status %d: %s", st, body)
	}
	if st, _, body := f.do("POST", "/v1/chat/completions", chatNonStream, "x-kvroute-tenant", "edge-team"); st != 200 {
		t.Fatalf("status %d: %s", st, body)
	}
	if a, e := tenantRequests(f, "team-a"), tenantRequests(f, "edge-team"); a != 1 || e != 1 {
		t.Fatalf("team-a %v, edge-team %v: want 1 and 1 (claim first, header only without a claim)", a, e)
	}
}
