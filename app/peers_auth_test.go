package app

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/config"
)

// peers.token_file, peers.tls.*: the files are read at startup; a bad one stops it
// with the key's name.
func TestPeersAuthFromConfig(t *testing.T) {
	dir := t.TempDir()
	testPKI(t, dir)
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("  s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := peersAuth(config.Peers{TokenFile: tok, TLS: config.PeersTLS{CertFile: filepath.Join(dir, "server.pem"),
		KeyFile: filepath.Join(dir, "server-key.pem"), CAFile: filepath.Join(dir, "ca.pem"), ServerName: "kvroute-peers"}})
	if err != nil {
		t.Fatal(err)
	}
	if a.Token != "s3cret" || !a.Authenticated() || a.ServerTLS.ClientAuth != tls.RequireAndVerifyClientCert || a.ServerTLS.ClientCAs == nil ||
		a.ClientTLS.RootCAs == nil || a.ClientTLS.ServerName != "kvroute-peers" || len(a.ClientTLS.Certificates) != 1 {
		t.Fatalf("auth %+v", a)
	}
	if a, err := peersAuth(config.Peers{TLS: config.PeersTLS{CertFile: filepath.Join(dir, "server.pem"), KeyFile: filepath.Join(dir, "server-key.pem")}}); err != nil ||
		a.Authenticated() || a.ServerTLS == nil || a.ServerTLS.ClientAuth != tls.NoClientCert {
		t.Fatalf("TLS without a CA encrypts but authenticates no peer: %+v, %v", a, err)
	}
	for name, tc := range map[string]struct {
		pc  config.Peers
		key string
	}{
		"missing token file": {config.Peers{TokenFile: filepath.Join(dir, "nope")}, "peers.token_file"},
		"empty token file":   {config.Peers{TokenFile: empty}, "peers.token_file"},
		"missing key":        {config.Peers{TLS: config.PeersTLS{CertFile: filepath.Join(dir, "server.pem"), KeyFile: filepath.Join(dir, "nope")}}, "peers.tls.cert_file"},
		"CA not PEM": {config.Peers{TLS: config.PeersTLS{CertFile: filepath.Join(dir, "server.pem"), KeyFile: filepath.Join(dir, "server-key.pem"),
			CAFile: tok}}, "peers.tls.ca_file"},
	} {
		if _, err := peersAuth(tc.pc); err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s: %v, want an error naming %s", name, err, tc.key)
		}
	}
}
