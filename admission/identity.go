package admission

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/config"
)

// Unattributed is the tenant of a request no identity source attributes.
const Unattributed = "unattributed"

// Identity is who a request is from, and which source said so.
type Identity struct {
	Tenant string
	// Source is the identity source that yielded Tenant: metadata, header, api_key, or
	// "none" for Unattributed.
	Source string
}

// Input is what a front knows about a request before the pick, for identity.
type Input struct {
	// Header returns the value of a request header (lower-case name), "" when absent.
	Header func(name string) string
	// Metadata is ext_proc's ProcessingRequest.metadata_context.filter_metadata
	// (namespace → struct); nil in proxy.
	Metadata map[string]*structpb.Struct
	// EdgeHeaders is true when the front guarantees the tenant header was set by the
	// trusted edge (ext_proc: the Envoy configuration removes the client's copy
	// before the filter that sets it). False in proxy, where Peer decides.
	EdgeHeaders bool
	// Peer is the client's address: the TCP peer (proxy), Envoy's source.address
	// attribute (ext_proc); the zero Addr when unknown. It decides whether a tenant
	// header is trusted (proxy) and keys the failed-API-key throttle (both fronts).
	Peer netip.Addr
}

// maxTenantLen bounds a tenant name from any source (bytes); longer is not a tenant.
const maxTenantLen = 128

// validTenant accepts printable ASCII names without spaces, up to maxTenantLen bytes.
func validTenant(s string) bool {
	if s == "" || len(s) > maxTenantLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// claim reads namespace/key/claim from ext_proc metadata: Envoy's jwt_authn with
// payload_in_metadata: key writes the verified payload as a struct under its filter
// name (the namespace), forwarded by ext_proc metadata_options.forwarding_namespaces.
func claim(md map[string]*structpb.Struct, namespace, key, name string) string {
	ns := md[namespace]
	if ns == nil {
		return ""
	}
	payload := ns.GetFields()[key].GetStructValue()
	v := payload.GetFields()[name]
	switch x := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return x.StringValue
	case *structpb.Value_NumberValue:
		return fmt.Sprint(x.NumberValue)
	}
	return ""
}

// apiKey returns the API key of a request: Authorization: Bearer <key>, else
// x-api-key (Anthropic's header).
func apiKey(header func(string) string) string {
	if a := header("authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
		return strings.TrimSpace(a[7:])
	}
	return strings.TrimSpace(header("x-api-key"))
}

// KeyHash is the SHA-256 of an API key, as the key file lists it (hex).
func KeyHash(key string) [sha256.Size]byte { return sha256.Sum256([]byte(key)) }

// maxKeyFileBytes bounds the API key file read at start (bytes).
const maxKeyFileBytes = 16 << 20

// LoadKeys reads an API key file: one "<sha256 hex> <tenant>" per line, blank lines
// and lines starting with # ignored. Errors name the line (never a key).
func LoadKeys(path string) (map[[sha256.Size]byte]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("admission: api key file: %w", err)
	}
	defer f.Close()
	return parseKeys(io.LimitReader(f, maxKeyFileBytes), path)
}

func parseKeys(r io.Reader, name string) (map[[sha256.Size]byte]string, error) {
	out := map[[sha256.Size]byte]string{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("admission: %s:%d: want \"<sha256 hex> <tenant>\"", name, n)
		}
		var h [sha256.Size]byte
		if b, err := hex.DecodeString(f[0]); err != nil || len(b) != sha256.Size {
			return nil, fmt.Errorf("admission: %s:%d: the first field is not a SHA-256 hex digest (64 hex digits)", name, n)
		} else {
			copy(h[:], b)
		}
		if !validTenant(f[1]) {
			return nil, fmt.Errorf("admission: %s:%d: tenant name must be 1–%d printable characters without spaces", name, n, maxTenantLen)
		}
		if _, dup := out[h]; dup {
			return nil, fmt.Errorf("admission: %s:%d: key hash listed twice", name, n)
		}
		out[h] = f[1]
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("admission: %s: %w", name, err)
	}
	return out, nil
}

// Identify returns the request's tenant from the configured sources, in order; the
// first that yields wins. A tenant header from a peer outside trusted_peers (proxy) and
// an API key not in the key file are ignored and counted. With require_tenant an
// unattributed request is refused with a 401 *router.Error. A client (in.Peer) past
// admission.auth_throttle's failed attempts is refused, when it presents an API key,
// with a 429 *router.Error before the key is looked up.
func (a *Admitter) Identify(in Input) (Identity, error) {
	if a == nil {
		return Identity{Tenant: Unattributed, Source: "none"}, nil
	}
	hdr := in.Header
	if hdr == nil {
		hdr = func(string) string { return "" }
	}
	c := &a.cfg
	for _, src := range c.Identity {
		var t string
		switch src {
		case "metadata":
			t = claim(in.Metadata, c.MetadataNamespace, c.MetadataKey, c.Claim)
		case "header":
			v := hdr(c.TenantHeader)
			if v == "" {
				continue
			}
			if !in.EdgeHeaders && !a.trusted(in.Peer) {
				a.m.UntrustedIdentity.WithLabelValues("header").Inc()
				continue
			}
			t = v
		case "api_key":
			k := apiKey(hdr)
			if k == "" {
				continue
			}
			now := a.now()
			if !a.auth.allowed(in.Peer, now) { // before the key is looked at
				a.m.AuthThrottled.Inc()
				a.refuse(a.labels.Labels(Unattributed, ""), "auth_throttled")
				return Identity{Tenant: Unattributed, Source: "none"}, a.auth.refusal()
			}
			var ok bool
			if t, ok = a.keys[KeyHash(k)]; !ok {
				a.m.UntrustedIdentity.WithLabelValues("api_key").Inc()
				a.auth.failed(in.Peer, now)
				continue
			}
		}
		if validTenant(t) {
			return Identity{Tenant: t, Source: src}, nil
		}
	}
	id := Identity{Tenant: Unattributed, Source: "none"}
	if c.RequireTenant {
		a.refuse(a.labels.Labels(id.Tenant, ""), "unauthenticated")
		return id, errUnauthenticated
	}
	return id, nil
}

func (a *Admitter) trusted(peer netip.Addr) bool {
	if !peer.IsValid() {
		return false
	}
	peer = peer.Unmap()
	for _, p := range a.peers {
		if p.Contains(peer) {
			return true
		}
	}
	return false
}

// TenantHeader is the request header a trusted edge sets to the tenant
// (admission.tenant_header; the default when a is nil). Fronts remove it before
// forwarding, so nothing behind the worker can be misled by a client's copy.
func (a *Admitter) TenantHeader() string {
	if a == nil {
		return config.Default().Admission.TenantHeader
	}
	return a.cfg.TenantHeader
}
