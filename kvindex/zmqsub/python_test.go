package zmqsub

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/workers"
)

// TestPythonPublisher subscribes to an independent publisher written with pyzmq and
// msgpack (testdata/pypub.py): same wire format from another encoder, a lost message
// replayed, negative-int and bin hashes, a legacy positional event. Skipped only when
// python3's zmq/msgpack are missing and CI is unset (scripts/deps.sh installs them).
func TestPythonPublisher(t *testing.T) {
	py := ""
	// Debian's python3-zmq/python3-msgpack live in /usr/bin/python3's path; a pyenv or
	// venv python3 earlier on PATH may lack them.
	for _, c := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(c, "-c", "import zmq, msgpack").Run() == nil {
			py = c
			break
		}
	}
	if py == "" {
		if os.Getenv("CI") == "" {
			t.Skip("python3 with zmq and msgpack not available; run scripts/deps.sh test")
		}
		t.Fatal("CI: python3 with zmq and msgpack required (scripts/deps.sh)")
	}
	cmd := exec.Command(py, "testdata/pypub.py")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		io.WriteString(stdin, "quit\n")
		stdin.Close()
		_ = cmd.Wait()
	})
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		t.Fatal("publisher printed nothing")
	}
	f := strings.Fields(lines.Text())
	if len(f) != 3 || f[0] != "READY" {
		t.Fatalf("publisher said %q", lines.Text())
	}
	h := newHarness(t)
	h.addWorkers(&workers.Worker{Name: "py", Address: "127.0.0.1:9", Models: []string{"m"},
		KVEvents: workers.KVEvents{Endpoint: f[1], ReplayEndpoint: f[2]}})
	h.eventually(func() bool {
		if s, ok := h.ix.Summary("py"); ok && s.Batches > 0 {
			return true
		}
		io.WriteString(stdin, "probe\n")
		return false
	}, "no batch from the python publisher")
	io.WriteString(stdin, "go\n")
	if !lines.Scan() || lines.Text() != "DONE" {
		t.Fatalf("publisher: %q", lines.Text())
	}
	h.eventually(func() bool { return h.held("py", toks(900, 1)) == 1 }, "legacy bin-hash event not applied")
	if got := h.held("py", toks(0, 3)); got != 3 {
		t.Fatalf("chain with the lost (replayed) block: %d blocks, want 3", got)
	}
	if got := h.held("py", toks(500, 1)); got != 1 {
		t.Fatal("negative int64 hash block not applied")
	}
	var cpu int
	for _, m := range h.ix.Lookup(keysOf(toks(900, 1)), nil) {
		cpu = m.ByTier[kvindex.TierCPU]
	}
	if cpu != 1 {
		t.Fatal("medium CPU not kept")
	}
	h.eventually(func() bool { return testutil.ToFloat64(h.ms.Replays.WithLabelValues("py", "ok")) >= 1 }, "no replay ok")
	if n := testutil.ToFloat64(h.ms.DecodeErrors.WithLabelValues("py")); n != 0 {
		t.Fatalf("decode errors = %v", n)
	}
}
