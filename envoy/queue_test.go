package envoy

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
)

// shippedConfigs are the kvroute configurations shipped beside Envoy bootstraps.
var shippedConfigs = []string{"../examples/kvroute.yaml", "../examples/docker-compose/kvroute.yaml"}

func loadConfig(t *testing.T, path string) *config.Config {
	t.Helper()
	c, err := config.Load(nil, func(k string) (string, bool) {
		if k == "KVROUTE_CONFIG" {
			return path, true
		}
		return "", false
	})
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

// Every shipped bootstrap's message_timeout covers the longest max_queue_time of every
// shipped kvroute configuration (kvroute holds the reply that long).
func TestShippedBootstrapsCoverQueueTime(t *testing.T) {
	var longest time.Duration
	for _, p := range shippedConfigs {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		longest = max(longest, loadConfig(t, p).Admission.MaxQueueTime())
	}
	for _, f := range files { // override_host has its own Expect (override_host_test.go); its timeout is checked below

		b, err := LoadBootstrap(f)
		if err != nil {
			t.Fatal(err)
		}
		e := expect()
		e.MaxQueueTime = longest
		if err := Check(e, b); err != nil {
			t.Errorf("%s vs the shipped kvroute configurations (longest max_queue_time %s): %v", f, longest, err)
		}
	}
}

// A queue longer than the bootstrap's message_timeout is caught, in every mode that
// has one (BUFFERED, override_host); FULL_DUPLEX_STREAMED has no per-message timer.
func TestCheckMessageTimeoutAgainstQueue(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvroute.yaml")
	os.WriteFile(path, []byte("admission:\n  classes:\n    - {name: interactive, ttft_objective: 2s, queue_limit: 100, max_queue_time: 30s}\n"), 0o600)
	q := loadConfig(t, path).Admission.MaxQueueTime()
	if q != 30*time.Second {
		t.Fatalf("MaxQueueTime %s", q)
	}
	for f, wantErr := range map[string]bool{"envoy-buffered.yaml": true, "envoy-override-host.yaml": true, "envoy-full-duplex.yaml": false} {
		b, err := LoadBootstrap(f)
		if err != nil {
			t.Fatal(err)
		}
		e := expect()
		e.MaxQueueTime = q
		err = Check(e, b)
		if got := errors.Is(err, ErrMessageTimeout); got != wantErr {
			t.Errorf("%s: ErrMessageTimeout %v, want %v (%v)", f, got, wantErr, err)
		}
	}
}
