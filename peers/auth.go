package peers

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"net"
	"net/netip"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Auth is how replicas prove themselves to each other. The zero value is none: every
// stream is plaintext and a peer is admitted only from the address of a target
// (Manager.known). Config refuses a listen address other hosts reach without
// authentication unless peers.insecure says so.
type Auth struct {
	// Token is a secret every replica shares. It is sent on every stream as
	// "authorization: Bearer TOKEN" and required of every inbound stream, compared in
	// constant time, before the stream's first summary is read ("" none).
	Token string
	// ServerTLS serves the exchange over TLS (nil: plaintext). ClientAuth
	// tls.RequireAndVerifyClientCert makes it mutual: the handshake refuses a peer
	// without a certificate signed by ClientCAs.
	ServerTLS *tls.Config
	// ClientTLS dials peers over TLS (nil: plaintext); with Certificates, this
	// replica's certificate for peers that require one.
	ClientTLS *tls.Config
}

// Authenticated reports whether every inbound stream proves itself: a token, or a
// client certificate the TLS handshake verified.
func (a Auth) Authenticated() bool {
	return a.Token != "" || a.ServerTLS != nil && a.ServerTLS.ClientAuth == tls.RequireAndVerifyClientCert
}

// Refusal reasons counted in kvroute_peers_dropped_total.
const (
	DropUnauthenticated = "unauthenticated" // no or wrong token
	DropUnknownPeer     = "unknown_peer"    // no authentication, and the source address is no target's
)

// serverOptions are the listener's TLS credentials and the token check.
func (m *Manager) serverOptions() []grpc.ServerOption {
	var opts []grpc.ServerOption
	if m.o.Auth.ServerTLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(m.o.Auth.ServerTLS)))
	}
	if m.o.Auth.Token != "" {
		want := sha256.Sum256([]byte(m.o.Auth.Token))
		opts = append(opts, grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if !tokenOK(ss.Context(), &want) {
				m.o.Metrics.Dropped.WithLabelValues(DropUnauthenticated).Inc()
				return status.Error(codes.Unauthenticated, "peers: missing or wrong peers token (authorization: Bearer)")
			}
			return h(srv, ss)
		}))
	}
	return opts
}

// tokenOK compares the stream's bearer token with want (a SHA-256, so the compare
// takes the same time whatever the length given) in constant time.
func tokenOK(ctx context.Context, want *[sha256.Size]byte) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	vs := md.Get("authorization")
	if len(vs) != 1 {
		return false
	}
	tok, ok := strings.CutPrefix(vs[0], "Bearer ")
	if !ok {
		return false
	}
	got := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// dialOptions are the client's TLS credentials and token.
func (m *Manager) dialOptions() []grpc.DialOption {
	var opts []grpc.DialOption
	if m.o.Auth.ClientTLS != nil {
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(m.o.Auth.ClientTLS)))
	} else {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	if m.o.Auth.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: m.o.Auth.Token, tls: m.o.Auth.ClientTLS != nil}))
	}
	return opts
}

// bearer sends the shared token on every stream.
type bearer struct {
	token string
	tls   bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity is false without TLS: the token then stops anyone who does
// not hold it, but not an eavesdropper on the path (docs/security.md).
func (b bearer) RequireTransportSecurity() bool { return b.tls }

// known reports whether a new peer may take a slot: always when every stream is
// authenticated; otherwise only when the stream's source address is the IP of a
// target (the static list or the discovery source, hosts resolved at each dial).
// A stream from anywhere else could claim any id, so it would fill MaxPeers with
// fakes. Caller holds m.mu.
func (m *Manager) knownLocked(remote string) bool {
	if m.o.Auth.Authenticated() {
		return true
	}
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return false
	}
	ip := ap.Addr().Unmap()
	for _, t := range m.targets {
		if p := t.ips.Load(); p != nil {
			for _, a := range *p {
				if a == ip {
					return true
				}
			}
		}
	}
	return false
}

// resolve records the IPs of t's host, which knownLocked admits inbound streams from.
func (t *target) resolve(ctx context.Context) {
	host, _, err := net.SplitHostPort(t.addr)
	if err != nil {
		return
	}
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip.Unmap()}
	} else if addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host); err == nil {
		for _, a := range addrs {
			ips = append(ips, a.Unmap())
		}
	} else if prev := t.ips.Load(); prev != nil {
		return // keep the last answer through a resolver failure
	}
	t.ips.Store(&ips)
}
