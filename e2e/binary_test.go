package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testport"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The real binary: `kvroute serve --config FILE` answers a stand-in request with a
// destination header, its gRPC health service answers for the ext_proc service, and
// SIGTERM shuts it down cleanly (ai-gateway's habit: test the binary beside Envoy).
func TestRealBinaryServe(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	w1, w2 := newTestWorker(t, "w1"), newTestWorker(t, "w2")
	ports := freePorts(t, 3)
	cfg := fmt.Sprintf(`server:
  ext_proc_addr: "127.0.0.1:%d"
  health_addr: "127.0.0.1:%d"
  admin_addr: "127.0.0.1:%d"
extproc:
  destination_header: x-gateway-destination-endpoint
models:
  - name: m
workers:
  - {name: w1, address: "%s"}
  - {name: w2, address: "%s"}
`, ports[0], ports[1], ports[2], w1.addr(), w2.addr())
	path := filepath.Join(t.TempDir(), "kvroute.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	runBinaryJourney(t, bin, ports, []*testWorker{w1, w2}, "serve", "--config", path)
}

// The shipped example configuration loads and serves, with the listeners and workers
// overridden by flags (every key is a flag).
func TestRealBinaryServeExampleConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	if _, err := os.Stat("../examples/kvroute.yaml"); err != nil {
		t.Skip("no examples/kvroute.yaml")
	}
	bin := buildBinary(t)
	w1 := newTestWorker(t, "w1")
	ports := freePorts(t, 3)
	runBinaryJourney(t, bin, ports, []*testWorker{w1}, "serve", "--config", "../examples/kvroute.yaml",
		fmt.Sprintf("--server.ext_proc_addr=127.0.0.1:%d", ports[0]), fmt.Sprintf("--server.health_addr=127.0.0.1:%d", ports[1]),
		fmt.Sprintf("--server.admin_addr=127.0.0.1:%d", ports[2]), "--models=[{name: m}]",
		fmt.Sprintf("--workers=[{name: w1, address: %q, models: [m]}]", w1.addr()))
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// buildBinary builds cmd/kvroute once per test binary run.
func buildBinary(t *testing.T) string {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvroute-e2e-")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "kvroute")
		if out, err := exec.Command("go", "build", "-o", builtBin, "../cmd/kvroute").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// runBinaryJourney starts the binary, waits for /readyz, checks gRPC health, sends one
// stand-in request (BUFFERED) that must reach a worker with the destination header,
// then SIGTERMs and expects a clean exit.
func runBinaryJourney(t *testing.T, bin string, ports []int, ws []*testWorker, args ...string) {
	var stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
	})
	admin := fmt.Sprintf("http://127.0.0.1:%d", ports[2])
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("kvroute exited: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvroute not ready\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", ports[1]), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "envoy.service.ext_proc.v3.ExternalProcessor"})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", hc, err)
	}

	e, err := New(generous(Config{ExtProcAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]), RequestBodyMode: Buffered, ResponseBodyMode: Streamed}))
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(e)
	defer front.Close()
	defer e.Close()
	resp, err := http.Post(front.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatStream))
	if err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	body.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(body.String(), "[DONE]") {
		t.Fatalf("status %d body %q\n%s", resp.StatusCode, body.String(), stderr.String())
	}
	var w *testWorker
	for _, x := range ws {
		if x.name == resp.Header.Get("X-Served-By") {
			w = x
		}
	}
	if w == nil {
		t.Fatalf("not served by a worker: %v", resp.Header)
	}
	if h, _ := w.last(); h.Get("X-Gateway-Destination-Endpoint") != w.addr() {
		t.Fatalf("destination header %q, want %q", h.Get("X-Gateway-Destination-Endpoint"), w.addr())
	}

	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("kvroute did not exit after SIGTERM")
	}
}

// freePorts returns n free loopback ports for servers that bind them later (vllm-sim,
// kvroute children), outside the kernel's ephemeral range (package testport says why).
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	return testport.Free(t, n)
}
