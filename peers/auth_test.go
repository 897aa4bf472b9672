package peers

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

func withAuth(a Auth) func(*Options) { return func(o *Options) { o.Auth = a } }

// rawStream opens an Exchange stream to addr as a hand-made peer would, on a
// connection of its own.
func rawStream(t *testing.T, addr string, opts ...grpc.DialOption) grpc.ClientStream {
	t.Helper()
	return streamOn(t, rawConn(t, addr, opts...))
}

// rawConn dials addr as a hand-made peer would; streams opened on it share the connection.
func rawConn(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func streamOn(t *testing.T, cc *grpc.ClientConn) grpc.ClientStream {
	t.Helper()
	st, err := openStream(context.Background(), cc)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// sendAndEnd sends s on st and returns the status the receiver ended the stream with.
func sendAndEnd(t *testing.T, st grpc.ClientStream, s *Summary) error {
	t.Helper()
	_ = st.SendMsg(&frame{b: encode(nil, s)})
	return st.RecvMsg(&frame{})
}

// With a token, a stream without it or with another one is refused before its summary
// is read, and replicas holding it exchange bookings.
func TestTokenAuthenticatesPeers(t *testing.T) {
	auth := withAuth(Auth{Token: "correct horse"})
	a := startReplica(t, "a", 5*time.Second, auth)
	b := startReplica(t, "b", 5*time.Second, auth)
	a.peer(b.addr)
	b.peer(a.addr)

	for name, opts := range map[string][]grpc.DialOption{
		"no token":    nil,
		"wrong token": {grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer{token: "correct horsf"})},
		"prefix only": {grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer{token: "correct"})},
	} {
		err := sendAndEnd(t, rawStream(t, b.addr, opts...), sampleSummary())
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("%s: stream ended with %v, want Unauthenticated", name, err)
		}
	}
	if got := testutil.ToFloat64(b.ms.Peers.Dropped.WithLabelValues(DropUnauthenticated)); got != 3 {
		t.Fatalf("dropped{unauthenticated} = %v, want 3", got)
	}
	if pb := b.r.PeerBookings(); pb["w0"].Requests != 0 {
		t.Fatalf("an unauthenticated summary was applied: %+v", pb)
	}

	tk, err := a.r.Pick(context.Background(), prompt(64), router.PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Abort()
	waitFor(t, "b imports a's booking over the authenticated stream", func() bool { return b.r.PeerBookings()[tk.Worker].Requests == 1 })
}

// Mutual TLS: replicas with certificates from the peers' CA exchange bookings; a
// client without a certificate, or with one from another CA, fails the handshake.
func TestMutualTLSAuthenticatesPeers(t *testing.T) {
	ca := newCA(t, "peers CA")
	mk := func(c *testCA) Auth {
		cert := c.issue(t, "kvroute-peers")
		return Auth{
			ServerTLS: &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: c.pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12},
			ClientTLS: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: c.pool, ServerName: "kvroute-peers", MinVersion: tls.VersionTLS12},
		}
	}
	a := startReplica(t, "a", 5*time.Second, withAuth(mk(ca)))
	b := startReplica(t, "b", 5*time.Second, withAuth(mk(ca)))
	a.peer(b.addr)
	b.peer(a.addr)
	tk, err := a.r.Pick(context.Background(), prompt(64), router.PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Abort()
	waitFor(t, "b imports a's booking over mutual TLS", func() bool { return b.r.PeerBookings()[tk.Worker].Requests == 1 })

	other := mk(newCA(t, "someone else's CA"))
	other.ClientTLS.RootCAs = ca.pool // it trusts our server; we must not trust it
	noCert := &tls.Config{RootCAs: ca.pool, ServerName: "kvroute-peers", MinVersion: tls.VersionTLS12}
	for name, cfg := range map[string]*tls.Config{"no client certificate": noCert, "foreign CA": other.ClientTLS} {
		st, err := func() (grpc.ClientStream, error) {
			cc, err := grpc.NewClient(b.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() { cc.Close() })
			return openStream(context.Background(), cc)
		}()
		if err == nil {
			err = sendAndEnd(t, st, sampleSummary())
		}
		if err == nil || status.Code(err) == codes.OK {
			t.Fatalf("%s: stream accepted", name)
		}
	}
	if v := b.m.Snapshot(); len(v.Peers) != 1 || v.Peers[0].ID != "a" {
		t.Fatalf("b's peers %+v, want a alone", v.Peers)
	}
}

// Fake ids must not take max_peers slots. Without authentication a stream is admitted
// only from a target's address; with it, only authenticated streams reach a slot.
func TestFakePeersTakeNoSlots(t *testing.T) {
	t.Run("unauthenticated, unknown address", func(t *testing.T) {
		b := startReplica(t, "b", 5*time.Second, func(o *Options) { o.MaxPeers = 2 })
		cc := rawConn(t, b.addr)
		for i := range 10 {
			s := sampleSummary()
			s.Replica = fmt.Sprintf("fake-%d", i)
			if err := sendAndEnd(t, streamOn(t, cc), s); status.Code(err) != codes.PermissionDenied {
				t.Fatalf("fake %d: %v, want PermissionDenied", i, err)
			}
		}
		if got := testutil.ToFloat64(b.ms.Peers.Dropped.WithLabelValues(DropUnknownPeer)); got != 10 {
			t.Fatalf("dropped{unknown_peer} = %v, want 10", got)
		}
		// Two real replicas, both targets of b: both get a slot.
		a1, a2 := startReplica(t, "a1", 5*time.Second), startReplica(t, "a2", 5*time.Second)
		for _, a := range []*replica{a1, a2} {
			a.peer(b.addr)
			b.peer(a.addr)
		}
		waitFor(t, "both real peers held", func() bool { return len(b.m.Snapshot().Peers) == 2 })
	})
	t.Run("token", func(t *testing.T) {
		auth := withAuth(Auth{Token: "s3cret"})
		b := startReplica(t, "b", 5*time.Second, auth, func(o *Options) { o.MaxPeers = 2 })
		b.peer("127.0.0.1:1") // a known address does not stand in for the token
		cc := rawConn(t, b.addr)
		for i := range 10 {
			s := sampleSummary()
			s.Replica = fmt.Sprintf("fake-%d", i)
			if err := sendAndEnd(t, streamOn(t, cc), s); status.Code(err) != codes.Unauthenticated {
				t.Fatalf("fake %d: %v, want Unauthenticated", i, err)
			}
		}
		a1, a2 := startReplica(t, "a1", 5*time.Second, auth), startReplica(t, "a2", 5*time.Second, auth)
		a1.peer(b.addr)
		a2.peer(b.addr)
		waitFor(t, "both authenticated peers held", func() bool { return len(b.m.Snapshot().Peers) == 2 })
	})
}

// A claim of 2^39 bookings on one worker (it overflowed the predicted TTFT to about
// −9.2·10⁹ s, which drew every request to that worker) is cut to
// peers.max_requests_per_worker: the prediction is finite and positive, and the same
// as for a claim at the bound.
func TestHugeClaimIsClamped(t *testing.T) {
	auth := withAuth(Auth{Token: "s3cret"})
	b := startReplica(t, "b", time.Minute, auth)
	tokenDial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer{token: "s3cret"})}
	const huge = 1 << 39
	s := &Summary{Replica: "liar", Incarnation: 1, Seq: 1, Sent: time.Now().Add(time.Hour), // a clock an hour ahead, too
		Workers: []WorkerSummary{{Worker: "w0", Booked: scoring.Booked{Requests: huge, Prefilling: huge, PrefillTokens: huge, Decoding: huge},
			Writes: huge, OldestPrefill: time.Now().Add(2 * time.Hour)}}}
	st := rawStream(t, b.addr, tokenDial...)
	if err := st.SendMsg(&frame{b: encode(nil, s)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the claim applied", func() bool { return b.r.PeerBookings()["w0"].Requests > 0 })
	got := b.r.PeerBookings()["w0"]
	c := DefaultClaims
	if got.Requests != c.MaxRequests || got.Prefilling != c.MaxRequests || got.Decoding != 0 || got.PrefillTokens != c.MaxRequests*c.MaxPromptTokens {
		t.Fatalf("imported %+v, want requests and prefilling %d, decoding 0 (prefilling ones are not decoding), prefill tokens %d",
			got.Booked, c.MaxRequests, c.MaxRequests*c.MaxPromptTokens)
	}
	if len(got.Writes) != 1 || got.Writes[0].Tokens != float64(c.MaxRequests)*float64(c.MaxPromptTokens) || got.Writes[0].At.After(time.Now()) {
		t.Fatalf("imported writes %+v: want cut to %d tokens, stamped no later than now", got.Writes, c.MaxRequests*c.MaxPromptTokens)
	}
	if n := testutil.ToFloat64(b.ms.Peers.Clamped); n != 1 {
		t.Fatalf("clamped_total = %v, want 1", n)
	}
	huge0 := predictW0(t, b)

	// The same claim at the bound predicts the same.
	s.Seq, s.Sent = 2, time.Now()
	s.Workers[0].Booked = scoring.Booked{Requests: c.MaxRequests, Prefilling: c.MaxRequests, PrefillTokens: c.MaxRequests * c.MaxPromptTokens}
	s.Workers[0].Writes, s.Workers[0].OldestPrefill = float64(c.MaxRequests)*float64(c.MaxPromptTokens), time.Time{}
	if err := st.SendMsg(&frame{b: encode(nil, s)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the bound claim applied", func() bool { return b.m.Snapshot().Peers[0].Seq == 2 })
	if atBound := predictW0(t, b); atBound != huge0 {
		t.Fatalf("w0's TTFT with a 2^39 claim %v, with a claim at the bound %v: want equal", huge0, atBound)
	}
	if huge0 <= 0 || huge0 > 3*scoring.MaxPredictedTerm {
		t.Fatalf("w0's predicted TTFT %v: want positive and finite", huge0)
	}
}

// predictW0 is b's predicted TTFT on w0 for a fresh prompt (scoring.Simple, b's policy).
func predictW0(t *testing.T, b *replica) time.Duration {
	t.Helper()
	ex, err := b.r.Explain(context.Background(), prompt(64), router.PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range ex.Candidates {
		if c := &ex.Candidates[i]; c.Worker.Name == "w0" {
			return b.r.Policy().(*scoring.Simple).Predict(ex.Input, c).TTFT
		}
	}
	t.Fatal("w0 is no candidate")
	return 0
}

// Without the token the 2^39 claim never reaches the router: every pick is where it
// would be without it.
func TestHugeClaimWithoutTokenMovesNothing(t *testing.T) {
	b := startReplica(t, "b", time.Minute, withAuth(Auth{Token: "s3cret"}))
	before := predictW0(t, b)
	s := &Summary{Replica: "liar", Incarnation: 1, Seq: 1, Sent: time.Now(),
		Workers: []WorkerSummary{{Worker: "w0", Booked: scoring.Booked{Requests: 1 << 39, PrefillTokens: 1 << 39}}}}
	if err := sendAndEnd(t, rawStream(t, b.addr), s); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("unauthenticated claim: %v", err)
	}
	if after := predictW0(t, b); after != before || len(b.r.PeerBookings()) != 0 {
		t.Fatalf("w0's TTFT %v → %v, peer bookings %+v: an unauthenticated claim moved the routing", before, after, b.r.PeerBookings())
	}
}

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// issue returns a certificate for dnsName (and 127.0.0.1), usable as server and client.
func (c *testCA) issue(t *testing.T, dnsName string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: dnsName}, DNSNames: []string{dnsName},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
