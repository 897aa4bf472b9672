package admission

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/router"
)

const testRedisPassword = "kv-s3cret-pw"

// A real redis-server with requirepass: the configured password authenticates (the
// reservation is charged in Redis: its minute counter shows it), a wrong one is a
// backend failure (fail_closed: 503), and the password appears in no log line,
// String, JSON or /debug view of the config.
func TestRedisPasswordAuth(t *testing.T) {
	srv := startRedisWith(t, redisServerOptions{Password: testRedisPassword})
	prefix := "kvtest:" + newTicket()[:8] + ":"
	limited := func(pw string) func(*config.Admission) {
		return func(c *config.Admission) {
			c.Redis.Password, c.Redis.Down = pw, "fail_closed"
			c.Tenants = []config.TenantLimits{{Name: "t", Limits: config.Limits{TokensPerMinute: 1000}}}
		}
	}
	a, ms := redisAdmitter(t, "redis", srv.Addr, prefix, fixed, limited(testRedisPassword))
	g, err := a.Reserve(Identity{Tenant: "t"}, Want{PromptTokens: 10, MaxTokens: 5})
	if err != nil {
		t.Fatalf("with the password: %v", err)
	}
	if n := testutil.ToFloat64(ms.Admission.BackendErrors.WithLabelValues("reserve")); n != 0 {
		t.Fatalf("backend errors %v with the right password, want 0", n)
	}
	var st *TenantState
	for _, s := range a.Snapshot() {
		if s.Tenant == "t" {
			st = &s
		}
	}
	if st == nil || st.WindowTokens != g.Reserved() || st.WindowTokens != 15 {
		t.Fatalf("redis minute counter %+v, want the 15 reserved tokens", st)
	}

	for _, pw := range []string{"wrong", ""} {
		b, bms := redisAdmitter(t, "redis", srv.Addr, prefix, fixed, limited(pw))
		_, err := b.Reserve(Identity{Tenant: "t"}, Want{PromptTokens: 10, MaxTokens: 5})
		if !isStatus(err, 503, "kvroute_admission_unavailable") {
			t.Fatalf("password %q: %v, want 503 unavailable (fail_closed)", pw, err)
		}
		if n := testutil.ToFloat64(bms.Admission.BackendErrors.WithLabelValues("reserve")); n != 1 {
			t.Fatalf("password %q: backend errors %v, want 1", pw, n)
		}
	}

	cfg := config.Default()
	cfg.Admission.Backend = "redis"
	cfg.Admission.Redis.Username, cfg.Admission.Redis.Password = "kvroute", testRedisPassword
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("config", "redis", cfg.Admission.Redis)
	js, _ := json.Marshal(cfg.Admission)
	for what, s := range map[string]string{"slog": logged.String(), "String": cfg.Admission.Redis.String(),
		"%v": fmt.Sprintf("%v %+v", cfg.Admission.Redis, cfg.Admission.Redis), "json": string(js)} {
		if strings.Contains(s, testRedisPassword) {
			t.Fatalf("%s shows the password: %s", what, s)
		}
	}
	if !strings.Contains(cfg.Admission.Redis.String(), "[redacted]") || !strings.Contains(logged.String(), `username:\"kvroute\"`) {
		t.Fatalf("String %q / log %q: want the username and a redacted password", cfg.Admission.Redis.String(), logged.String())
	}
}

func isStatus(err error, status int, details string) bool {
	var re *router.Error
	return errors.As(err, &re) && re.Status == status && re.Details == details
}

// TLS keys: validation names the key, the CA file must be readable and hold a PEM
// certificate, a client pair must load.
func TestRedisTLSConfigValidated(t *testing.T) {
	dir := t.TempDir()
	files := writeTestPKI(t, dir)
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tls  config.RedisTLS
		want string // "" = valid
	}{
		{config.RedisTLS{}, ""},
		{config.RedisTLS{Enabled: true}, ""},
		{config.RedisTLS{Enabled: true, CAFile: files.CA}, ""},
		{config.RedisTLS{Enabled: true, CAFile: files.CA, CertFile: files.Cert, KeyFile: files.Key}, ""},
		{config.RedisTLS{Enabled: true, CAFile: filepath.Join(dir, "missing.pem")}, "admission.redis.tls.ca_file: open"},
		{config.RedisTLS{Enabled: true, CAFile: garbage}, "admission.redis.tls.ca_file: " + garbage + " holds no PEM certificate"},
		{config.RedisTLS{Enabled: true, CertFile: files.Cert, KeyFile: garbage}, "admission.redis.tls.cert_file/key_file"},
	} {
		tc, err := RedisTLSConfig(c.tls)
		switch {
		case c.want == "" && err != nil:
			t.Fatalf("%+v: %v, want valid", c.tls, err)
		case c.want != "" && (err == nil || !strings.HasPrefix(err.Error(), c.want)):
			t.Fatalf("%+v: %v, want %q", c.tls, err, c.want)
		case c.want == "" && c.tls.Enabled && (tc == nil || tc.MinVersion < 0x0303 || (c.tls.CAFile != "") != (tc.RootCAs != nil)):
			t.Fatalf("%+v: tls config %+v", c.tls, tc)
		case !c.tls.Enabled && tc != nil:
			t.Fatalf("TLS off: config %+v, want nil", tc)
		}
	}
	// admission.New fails on a bad file, config.Validate on inconsistent keys
	cfg := config.Default()
	cfg.Admission.Backend = "redis"
	cfg.Admission.Redis.TLS = config.RedisTLS{Enabled: true, CAFile: garbage}
	if _, err := New(Options{Config: cfg.Admission}); err == nil || !strings.Contains(err.Error(), "admission.redis.tls.ca_file") {
		t.Fatalf("New with a garbage CA file: %v", err)
	}
	for _, c := range []struct {
		mod  func(*config.RedisBudget)
		want string
	}{
		{func(r *config.RedisBudget) { r.TLS = config.RedisTLS{CAFile: files.CA} }, "admission.redis.tls.enabled"},
		{func(r *config.RedisBudget) { r.TLS = config.RedisTLS{Enabled: true, CertFile: files.Cert} }, "admission.redis.tls.cert_file"},
		{func(r *config.RedisBudget) { r.Username = "kvroute" }, "admission.redis.password"},
	} {
		cfg := config.Default()
		cfg.Admission.Backend = "redis"
		c.mod(&cfg.Admission.Redis)
		var fe *config.FieldError
		if err := cfg.Validate(); !errors.As(err, &fe) || fe.Key != c.want {
			t.Fatalf("want an error on %s, got %v", c.want, err)
		}
	}
}

// A real redis-server serving TLS only: a client with tls.enabled and the CA
// reserves; one without TLS cannot talk to it (a backend failure).
func TestRedisTLSReal(t *testing.T) {
	files := writeTestPKI(t, t.TempDir())
	srv := startRedisWith(t, redisServerOptions{Password: testRedisPassword, TLS: &files})
	prefix := "kvtest:" + newTicket()[:8] + ":"
	a, ms := redisAdmitter(t, "redis", srv.Addr, prefix, fixed, func(c *config.Admission) {
		c.Redis.Password, c.Redis.Down = testRedisPassword, "fail_closed"
		c.Redis.TLS = config.RedisTLS{Enabled: true, CAFile: files.CA}
		c.Tenants = []config.TenantLimits{{Name: "t", Limits: config.Limits{TokensPerMinute: 1000}}}
	})
	if _, err := a.Reserve(Identity{Tenant: "t"}, Want{PromptTokens: 10, MaxTokens: 5}); err != nil {
		t.Fatalf("over TLS: %v", err)
	}
	if n := testutil.ToFloat64(ms.Admission.BackendErrors.WithLabelValues("reserve")); n != 0 {
		t.Fatalf("backend errors %v over TLS, want 0", n)
	}
	b, bms := redisAdmitter(t, "redis", srv.Addr, prefix, fixed, func(c *config.Admission) {
		c.Redis.Password, c.Redis.Down = testRedisPassword, "fail_closed"
		c.Tenants = []config.TenantLimits{{Name: "t", Limits: config.Limits{TokensPerMinute: 1000}}}
	})
	if _, err := b.Reserve(Identity{Tenant: "t"}, Want{PromptTokens: 10, MaxTokens: 5}); !isStatus(err, 503, "kvroute_admission_unavailable") {
		t.Fatalf("plaintext to a TLS server: %v, want 503 unavailable", err)
	}
	if n := testutil.ToFloat64(bms.Admission.BackendErrors.WithLabelValues("reserve")); n != 1 {
		t.Fatalf("plaintext: backend errors %v, want 1", n)
	}
}

// writeTestPKI writes a CA and a server certificate for 127.0.0.1 signed by it.
func writeTestPKI(t *testing.T, dir string) redisTLSFiles {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kvroute test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	f := redisTLSFiles{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "server.pem"), Key: filepath.Join(dir, "server.key")}
	for path, b := range map[string]*pem.Block{f.CA: {Type: "CERTIFICATE", Bytes: caDER}, f.Cert: {Type: "CERTIFICATE", Bytes: der},
		f.Key: {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}
