package admission

import (
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/front"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/router"
)

// throttled builds an Admitter with api_key identity and admission.auth_throttle
// {failures, 1m, maxClients} on a clock the test moves.
func throttled(t *testing.T, failures, maxClients int, now *time.Time) (*Admitter, func(peer, key string) (Identity, error)) {
	t.Helper()
	path := keyFile(t, hashHex("sk-good")+" alpha")
	a, _ := newAdmitter(t, func(c *config.Admission) {
		c.Identity, c.APIKeysFile = []string{"api_key"}, path
		c.AuthThrottle = config.AuthThrottle{Failures: failures, Window: time.Minute, MaxClients: maxClients}
	})
	a.now = func() time.Time { return *now }
	try := func(peer, key string) (Identity, error) {
		var p netip.Addr
		if peer != "" {
			p = netip.MustParseAddr(peer)
		}
		return a.Identify(Input{Header: headers("authorization", "Bearer "+key), Peer: p})
	}
	return a, try
}

func isThrottled(err error) bool {
	var re *router.Error
	return errors.As(err, &re) && re.Status == http.StatusTooManyRequests && re.Details == "kvroute_admission_auth_throttled"
}

// After admission.auth_throttle.failures unknown keys from one client address, that
// address is refused 429 for any API key — the right one included, since it is not
// looked at — until its bucket refills (failures per window); other addresses are
// unaffected, an IPv6 client counts by its /64, and a front that does not know its
// client (zero address) is never throttled.
func TestAuthThrottlePerClient(t *testing.T) {
	now := fixed()
	a, try := throttled(t, 3, 100, &now)
	for i := 0; i < 3; i++ {
		if id, err := try("10.0.0.1", "sk-guess"); err != nil || id.Tenant != Unattributed {
			t.Fatalf("guess %d: %+v %v, want unattributed (no require_tenant)", i, id, err)
		}
	}
	_, err := try("10.0.0.1", "sk-good")
	if !isThrottled(err) {
		t.Fatalf("4th attempt after 3 failures: %v, want the auth_throttled 429", err)
	}
	rep := front.ErrorReply(request.APIMessages, err)
	if rep.Status != 429 || !strings.Contains(string(rep.Body), `"type":"error"`) || !strings.Contains(string(rep.Body), "rate_limit") {
		t.Fatalf("Anthropic shape: %d %s", rep.Status, rep.Body)
	}
	var re *router.Error
	errors.As(err, &re)
	if re.RetryAfter != 20*time.Second { // 3 per minute: one attempt back every 20 s
		t.Fatalf("Retry-After %v, want 20s", re.RetryAfter)
	}
	if id, err := try("10.0.0.2", "sk-good"); err != nil || id.Tenant != "alpha" {
		t.Fatalf("another client: %+v %v", id, err)
	}
	if id, err := try("", "sk-guess"); err != nil || id.Tenant != Unattributed {
		t.Fatalf("unknown client address: %+v %v", id, err)
	}
	if testutil.ToFloat64(a.m.AuthThrottled) != 1 || testutil.ToFloat64(a.m.Refused.WithLabelValues(Unattributed, "default", "auth_throttled")) != 1 ||
		testutil.ToFloat64(a.m.UntrustedIdentity.WithLabelValues("api_key")) != 4 {
		t.Fatalf("throttled %v, refused %v, unknown keys %v", testutil.ToFloat64(a.m.AuthThrottled),
			testutil.ToFloat64(a.m.Refused.WithLabelValues(Unattributed, "default", "auth_throttled")),
			testutil.ToFloat64(a.m.UntrustedIdentity.WithLabelValues("api_key")))
	}
	// 20 s later one attempt is back: the good key works, and one more guess empties it.
	now = now.Add(20 * time.Second)
	if id, err := try("10.0.0.1", "sk-good"); err != nil || id.Tenant != "alpha" {
		t.Fatalf("after refill: %+v %v", id, err)
	}
	if _, err := try("10.0.0.1", "sk-guess"); err != nil {
		t.Fatal(err)
	}
	if _, err := try("10.0.0.1", "sk-good"); !isThrottled(err) {
		t.Fatalf("refilled token spent on a guess: %v, want 429", err)
	}
	// IPv6: one /64 is one client; another /64 is another.
	for i := 0; i < 3; i++ {
		try("2001:db8:0:1::"+string(rune('a'+i)), "sk-guess")
	}
	if _, err := try("2001:db8:0:1::ffff", "sk-good"); !isThrottled(err) {
		t.Fatalf("same /64: %v, want 429", err)
	}
	if _, err := try("2001:db8:0:2::1", "sk-good"); err != nil {
		t.Fatalf("other /64: %v", err)
	}
	if _, err := try("::ffff:10.0.0.1", "sk-good"); !isThrottled(err) {
		t.Fatalf("IPv4-mapped form of a throttled client: %v, want 429", err)
	}
}

// The throttle's memory is bounded: at most max_clients addresses are tracked, the
// least recently failed evicted (it starts again with a full bucket).
func TestAuthThrottleBoundedLRU(t *testing.T) {
	now := fixed()
	a, try := throttled(t, 1, 4, &now)
	for i := 0; i < 1000; i++ {
		try(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}).String(), "sk-guess")
	}
	if n := a.auth.len(); n != 4 {
		t.Fatalf("%d clients tracked, want max_clients 4", n)
	}
	if _, err := try("10.1.3.231", "sk-good"); !isThrottled(err) { // i = 999, the latest: still tracked
		t.Fatalf("latest client: %v, want 429", err)
	}
	if _, err := try("10.1.0.0", "sk-good"); err != nil { // i = 0: evicted long ago
		t.Fatalf("evicted client: %v", err)
	}
}

// failures 0 turns the throttle off; negative values and a zero window are refused.
func TestAuthThrottleConfig(t *testing.T) {
	now := fixed()
	_, try := throttled(t, 0, 1, &now)
	for i := 0; i < 50; i++ {
		if _, err := try("10.0.0.1", "sk-guess"); err != nil {
			t.Fatalf("off: %v", err)
		}
	}
	for _, bad := range []config.AuthThrottle{{Failures: -1}, {Failures: 5, Window: 0, MaxClients: 1}, {Failures: 5, Window: time.Minute}} {
		cfg := config.Default()
		cfg.Admission.AuthThrottle = bad
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "admission.auth_throttle") {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
}
