package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if builtBin != "" {
		os.RemoveAll(filepath.Dir(builtBin))
	}
	os.Exit(code)
}

// testMessageTimeout is the stand-in's message_timeout in tests that are not about the
// timeout: Envoy's 200 ms default (what New applies) is a wall-clock bound that a loaded
// 2-core CI machine misses (issue 11 item 16: TestResponseTrailers got 504 once).
const testMessageTimeout = 30 * time.Second

// generous returns c with testMessageTimeout when c sets no message_timeout.
func generous(c Config) Config {
	if c.MessageTimeout <= 0 {
		c.MessageTimeout = testMessageTimeout
	}
	return c
}
