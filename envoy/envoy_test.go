package envoy

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	jwtv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"

	"github.com/kvroute/kvroute/config"
)

// files are the bootstrap variants shipped in this directory.
var files = []string{"envoy-buffered.yaml", "envoy-full-duplex.yaml", "envoy-jwt.yaml"}

// expect is kvroute's default configuration, which the shipped files must match.
func expect() Expect {
	d := config.Default()
	return Expect{DestinationHeader: d.ExtProc.DestinationHeader, MetadataNamespace: d.ExtProc.MetadataNamespace, TenantHeader: d.Admission.TenantHeader,
		ClaimNamespace: d.Admission.MetadataNamespace, ClaimKey: d.Admission.MetadataKey}
}

func load(t *testing.T, text string) (*bootstrapv3.Bootstrap, error) {
	t.Helper()
	var b bootstrapv3.Bootstrap
	if err := Unmarshal([]byte(text), &b); err != nil {
		return nil, err
	}
	if err := ValidateDeep(&b); err != nil {
		return nil, err
	}
	return &b, nil
}

func TestShippedBootstrapsPassEveryCheck(t *testing.T) {
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			b, err := LoadBootstrap(f)
			if err != nil {
				t.Fatalf("Envoy would refuse %s: %v", f, err)
			}
			if err := Check(expect(), b); err != nil {
				t.Fatalf("%s disagrees with kvroute's configuration:\n%v", f, err)
			}
		})
	}
}

func TestShippedBootstrapModes(t *testing.T) {
	for _, tc := range []struct{ file, body, failOpen string }{
		{"envoy-buffered.yaml", "request_body_mode: BUFFERED", "failure_mode_allow: true"},
		{"envoy-full-duplex.yaml", "request_body_mode: FULL_DUPLEX_STREAMED", "failure_mode_allow: false"},
		{"envoy-jwt.yaml", "request_body_mode: BUFFERED", "failure_mode_allow: true"},
	} {
		text := read(t, tc.file)
		for _, want := range []string{tc.body, tc.failOpen, "response_body_mode: STREAMED", "response_trailer_mode: SEND"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s: the variant is defined by %q, which is missing", tc.file, want)
			}
		}
	}
}

func read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// mutate returns text with old replaced by new, failing if old does not occur (so a
// broken copy really is broken).
func mutate(t *testing.T, text, old, new string) string {
	t.Helper()
	if !strings.Contains(text, old) {
		t.Fatalf("mutation target %q not found", old)
	}
	return strings.Replace(text, old, new, 1)
}

func TestLoadIsStrict(t *testing.T) {
	good := read(t, "envoy-buffered.yaml")
	for _, tc := range []struct{ name, old, new, want string }{
		{"unknown field", "stat_prefix: llm", "stat_prefix: llm\n                stat_prefx: typo", "stat_prefx"},
		{"unknown @type", "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router", "type.googleapis.com/envoy.extensions.filters.http.router.v3.Routr", "Routr"},
		{"bad enum", "request_body_mode: BUFFERED", "request_body_mode: BUFFER", "BUFFER"},
		{"yaml", "admin:", "admin: [", "yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, mutate(t, good, tc.old, tc.new))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Envoy rejects this copy, so must the loader; got %v", err)
			}
		})
	}
	if _, err := LoadBootstrap(filepath.Join(t.TempDir(), "absent.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: got %v", err)
	}
}

// A rule violation inside a typed_config is invisible to the top-level ValidateAll and
// must be caught by ValidateDeep.
func TestValidateDeepLooksInsideAny(t *testing.T) {
	good := read(t, "envoy-buffered.yaml")
	for _, tc := range []struct{ name, old, new string }{
		{"hcm stat_prefix min_len", "stat_prefix: llm", `stat_prefix: ""`},
		{"ext_proc message_timeout range", "message_timeout: 2s", "message_timeout: 7200s"},
		{"http2 keepalive interval", "connection_keepalive: {interval: 30s, timeout: 5s}", "connection_keepalive: {interval: 0.0001s, timeout: 5s}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bootstrapv3.Bootstrap
			if err := Unmarshal([]byte(mutate(t, good, tc.old, tc.new)), &b); err != nil {
				t.Fatal(err)
			}
			if err := b.ValidateAll(); err != nil {
				t.Fatalf("premise: top-level ValidateAll was expected to miss this, got %v", err)
			}
			if err := ValidateDeep(&b); !errors.Is(err, ErrInvalid) {
				t.Fatalf("ValidateDeep must validate typed_config payloads; got %v", err)
			}
		})
	}
}

// Each broken copy must fail exactly the check it breaks.
func TestCheckCatchesBrokenCopies(t *testing.T) {
	for _, tc := range []struct {
		name, file, old, new string
		want                 error
	}{
		{"route to undefined cluster", "envoy-buffered.yaml", "cluster: vllm_workers", "cluster: vllm", ErrUnknownCluster},
		{"ext_proc to undefined cluster", "envoy-buffered.yaml", "cluster_name: kvroute\n", "cluster_name: kvrout\n", ErrUnknownCluster},
		{"ORIGINAL_DST round robin", "envoy-buffered.yaml", "lb_policy: CLUSTER_PROVIDED", "lb_policy: ROUND_ROBIN", ErrOriginalDst},
		{"ORIGINAL_DST without use_http_header", "envoy-full-duplex.yaml", "use_http_header: true", "use_http_header: false", ErrOriginalDst},
		{"other header", "envoy-buffered.yaml", "http_header_name: x-gateway-destination-endpoint", "http_header_name: x-envoy-original-dst-host", ErrDestinationHeader},
		{"no ORIGINAL_DST cluster", "envoy-buffered.yaml", "type: ORIGINAL_DST", "type: STATIC", ErrMissing},
		{"ext_proc over HTTP/1", "envoy-buffered.yaml", "http2_protocol_options:\n              connection_keepalive: {interval: 30s, timeout: 5s}", "http_protocol_options: {}", ErrExtProcNotHTTP2},
		{"ext_proc without health check", "envoy-buffered.yaml", "grpc_health_check:\n            service_name: envoy.service.ext_proc.v3.ExternalProcessor", "tcp_health_check: {}", ErrNoHealthCheck},
		{"ext_proc cluster of one replica", "envoy-buffered.yaml", "- name: kvroute\n      type: STRICT_DNS", "- name: kvroute\n      type: LOGICAL_DNS", ErrOneReplica},
		{"request headers skipped", "envoy-buffered.yaml", "request_header_mode: SEND", "request_header_mode: SKIP", ErrProcessingMode},
		{"full duplex without request trailers", "envoy-full-duplex.yaml", "request_trailer_mode: SEND", "request_trailer_mode: SKIP", ErrFullDuplex},
		{"full duplex fail open", "envoy-full-duplex.yaml", "failure_mode_allow: false", "failure_mode_allow: true", ErrFullDuplex},
		{"buffered turned full duplex", "envoy-buffered.yaml", "request_body_mode: BUFFERED", "request_body_mode: FULL_DUPLEX_STREAMED", ErrFullDuplex},
		{"envoy.lb not accepted", "envoy-buffered.yaml", "untyped: [envoy.lb]", "untyped: [other]", ErrMetadataNamespace},
		{"mode override", "envoy-full-duplex.yaml", "allow_mode_override: false", "allow_mode_override: true", ErrModeOverride},
		{"router before ext_proc", "envoy-buffered.yaml", "- name: envoy.filters.http.ext_proc", "- name: envoy.filters.http.ext_proc_moved", ErrFilterOrder},
		// Issue 10 item 4: a client never chooses its worker, kvroute down or not.
		{"client destination header kept", "envoy-buffered.yaml", "- remove: x-gateway-destination-endpoint\n", "- remove: x-other\n", ErrClientHeader},
		{"client served header kept", "envoy-full-duplex.yaml", "- remove: x-gateway-destination-endpoint-served", "- remove: x-other", ErrClientHeader},
		{"client tenant header kept", "envoy-buffered.yaml", "- remove: x-kvroute-tenant", "- remove: x-other", ErrClientHeader},
		{"ORIGINAL_DST route without header guard", "envoy-buffered.yaml", "present_match: true", "present_match: false", ErrFailOpen},
		{"fallback to ORIGINAL_DST", "envoy-buffered.yaml", "cluster: vllm_fallback\n", "cluster: vllm_workers\n", ErrFailOpen},
		{"route not re-selected after kvroute", "envoy-buffered.yaml", "route_cache_action: CLEAR", "route_cache_action: DEFAULT", ErrFailOpen},
		// Issue 14: the verified JWT payload reaches kvroute's admission.
		{"jwt payload not in metadata", "envoy-jwt.yaml", "payload_in_metadata: jwt_payload", "forward_payload_header: x-jwt", ErrJWT},
		{"jwt payload under another key", "envoy-jwt.yaml", "payload_in_metadata: jwt_payload", "payload_in_metadata: claims", ErrJWT},
		{"jwt namespace not forwarded", "envoy-jwt.yaml", "untyped: [envoy.filters.http.jwt_authn]", "untyped: [envoy.lb]", ErrJWT},
		{"jwt tenant header kept", "envoy-jwt.yaml", "- remove: x-kvroute-tenant", "- remove: x-other", ErrClientHeader},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := load(t, mutate(t, read(t, tc.file), tc.old, tc.new))
			if err != nil {
				t.Fatalf("the broken copy should still load (only Check can see this): %v", err)
			}
			err = Check(expect(), b)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Check must report %v; got %v", tc.want, err)
			}
		})
	}
}

func TestCheckFilterOrderSwapped(t *testing.T) {
	// Swap ext_proc and router inside the http_connection_manager.
	text := read(t, "envoy-buffered.yaml")
	start := strings.Index(text, "                  - name: envoy.filters.http.ext_proc")
	mid := strings.Index(text, "                  - name: envoy.filters.http.router")
	end := strings.Index(text, "  clusters:")
	swapped := text[:start] + text[mid:end] + text[start:mid] + text[end:]
	b, err := load(t, swapped)
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(expect(), b); !errors.Is(err, ErrFilterOrder) {
		t.Fatalf("the router must be last and ext_proc before it; got %v", err)
	}
}

func TestCheckKnownClusters(t *testing.T) {
	b, err := load(t, mutate(t, read(t, "envoy-buffered.yaml"), "cluster: vllm_workers", "cluster: outbound|8000||vllm.svc"))
	if err != nil {
		t.Fatal(err)
	}
	e := expect()
	e.KnownClusters = []string{"outbound|8000||vllm.svc"}
	if err := Check(e, b); err != nil {
		t.Fatalf("a cluster defined elsewhere (KnownClusters) is a valid reference: %v", err)
	}
}

// The jwt_authn variant: ext_proc runs only after jwt_authn verified a token from a
// local JWKS on every path (no rule lets a request through without one), the token
// does not reach the worker, and kvroute's claim source is the forwarded payload.
func TestJWTVariant(t *testing.T) {
	const file = "envoy-jwt.yaml"
	b, err := LoadBootstrap(file)
	if err != nil {
		t.Fatalf("Envoy would refuse %s: %v", file, err)
	}
	var (
		ja      *jwtv3.JwtAuthentication
		filters []string
	)
	err = Walk(b, func(m proto.Message, _ bool) error {
		switch x := m.(type) {
		case *jwtv3.JwtAuthentication:
			ja = x
		case *hcmv3.HttpConnectionManager:
			for _, f := range x.GetHttpFilters() {
				filters = append(filters, f.GetName())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if ja == nil {
		t.Fatal("no jwt_authn filter")
	}
	if want := []string{JWTAuthnFilter, ExtProcFilter, RouterFilter}; !slices.Equal(filters, want) {
		t.Errorf("http filters %v, want %v", filters, want)
	}
	if len(ja.GetProviders()) == 0 {
		t.Fatal("no provider")
	}
	for name, p := range ja.GetProviders() {
		if p.GetLocalJwks() == nil {
			t.Errorf("provider %s: want a local JWKS (no fetch on the request path)", name)
		}
		if p.GetForward() {
			t.Errorf("provider %s: forward: true sends the token on to the worker", name)
		}
		if p.GetIssuer() == "" || len(p.GetAudiences()) == 0 || !p.GetRequireExpiration() {
			t.Errorf("provider %s: issuer, audiences and require_expiration must be set", name)
		}
	}
	if len(ja.GetRules()) == 0 {
		t.Fatal("no rules: jwt_authn would verify nothing")
	}
	for _, r := range ja.GetRules() {
		if r.GetMatch().GetPrefix() != "/" || r.GetRequires().GetProviderName() == "" {
			t.Errorf("rule %v: every path must require a provider's token", r)
		}
	}
	// The kvroute side of the file's comment is the default configuration.
	d := config.Default().Admission
	if d.MetadataNamespace != JWTAuthnFilter || d.MetadataKey != "jwt_payload" {
		t.Errorf("kvroute's defaults %s/%s no longer match the variant's comment", d.MetadataNamespace, d.MetadataKey)
	}
}

// A jwt_authn filter after ext_proc: kvroute would read the claim before it exists.
func TestCheckJWTAfterExtProc(t *testing.T) {
	text := read(t, "envoy-jwt.yaml")
	start := strings.Index(text, "                  # Verifies the client's JWT")
	mid := strings.Index(text, "                  - name: envoy.filters.http.ext_proc")
	end := strings.Index(text, "                  - name: envoy.filters.http.router")
	swapped := text[:start] + text[mid:end] + text[start:mid] + text[end:]
	b, err := load(t, swapped)
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(expect(), b); !errors.Is(err, ErrJWT) {
		t.Fatalf("jwt_authn must run before ext_proc; got %v", err)
	}
}
