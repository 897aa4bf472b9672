package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/testrun"
)

// testPKI writes a CA, a server certificate for 127.0.0.1 and a client certificate
// (PEM) into dir, and returns the CA pool and the client key pair.
func testPKI(t *testing.T, dir string) (*x509.CertPool, tls.Certificate) {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"}, NotBefore: now.Add(-time.Hour),
		NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	write("ca.pem", "CERTIFICATE", caDER)
	issue := func(serial int64, usage x509.ExtKeyUsage, prefix string) tls.Certificate {
		k := key()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: prefix}, NotBefore: now.Add(-time.Hour),
			NotAfter: now.Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kd, _ := x509.MarshalECPrivateKey(k)
		write(prefix+".pem", "CERTIFICATE", der)
		write(prefix+"-key.pem", "EC PRIVATE KEY", kd)
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, prefix+".pem"), filepath.Join(dir, prefix+"-key.pem"))
		if err != nil {
			t.Fatal(err)
		}
		return pair
	}
	issue(2, x509.ExtKeyUsageServerAuth, "server")
	client := issue(3, x509.ExtKeyUsageClientAuth, "client")
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pool, client
}

// Issue 10 item 8: the ext_proc listener serves TLS with mTLS when configured: a client
// with a certificate from the configured CA is served, one without is refused.
func TestExtProcMTLS(t *testing.T) {
	dir := t.TempDir()
	pool, clientCert := testPKI(t, dir)
	cfg := config.Default()
	cfg.Server.ExtProcTLSCert = filepath.Join(dir, "server.pem")
	cfg.Server.ExtProcTLSKey = filepath.Join(dir, "server-key.pem")
	cfg.Server.ExtProcTLSClientCA = filepath.Join(dir, "ca.pem")
	a, err := New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln := testrun.Listen(t)
	testrun.Start(t, a, Listeners{ExtProc: ln})
	check := func(certs []tls.Certificate) error {
		creds := credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: certs, MinVersion: tls.VersionTLS12})
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer ccancel()
		_, err = healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := check([]tls.Certificate{clientCert}); err != nil {
		t.Fatalf("a client with a certificate from the CA must be served: %v", err)
	}
	if err := check(nil); err == nil {
		t.Fatal("a client without a certificate must be refused (mTLS)")
	}
}
