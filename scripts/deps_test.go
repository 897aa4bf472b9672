package scripts_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// depsPath returns a directory to use as the whole PATH of scripts/deps.sh: links to
// the real commands named (bash for its #! line, and what the script calls), and
// nothing else, so that every command left out (npm, node, redis-server, curl,
// apt-get) is missing as on a fresh non-root user's machine. Without apt-get the script
// names the packages even when the test runs as root.
func depsPath(t *testing.T, cmds ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, c := range append([]string{"bash", "dirname", "id"}, cmds...) {
		p, err := exec.LookPath(c)
		if err != nil {
			t.Skipf("%s is not installed here", c)
		}
		if err := os.Symlink(p, filepath.Join(dir, c)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func runDeps(t *testing.T, path string, args ...string) (int, string) {
	t.Helper()
	script, err := filepath.Abs("deps.sh")
	if err != nil {
		t.Fatal(err)
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("bash is not installed")
	}
	cmd := exec.Command(bash, append([]string{script}, args...)...)
	cmd.Env = []string{"PATH=" + path, "HOME=" + t.TempDir()}
	return runStderr(t, cmd)
}

// `make build` needs Go, pkg-config and libzmq only: with those and without npm, node,
// redis-server or curl it passes; `make test` then stops and names exactly what is
// missing and the command that installs it.
func TestDepsSplitsBuildFromTest(t *testing.T) {
	if exec.Command("pkg-config", "--exists", "libzmq").Run() != nil {
		t.Skip("libzmq3-dev is not installed here")
	}
	if exec.Command("/usr/bin/python3", "-c", "import zmq, msgpack").Run() != nil {
		t.Skip("python3-zmq and python3-msgpack are not installed here")
	}
	path := depsPath(t, "go", "pkg-config")
	if rc, stderr := runDeps(t, path, "build"); rc != 0 || stderr != "" {
		t.Fatalf("deps.sh build without the test tools: rc %d, stderr %q", rc, stderr)
	}
	if rc, stderr := runDeps(t, path); rc != 0 || stderr != "" {
		t.Fatalf("deps.sh (build by default): rc %d, stderr %q", rc, stderr)
	}
	rc, stderr := runDeps(t, path, "test")
	want := "deps: make test needs system packages that are missing: curl nodejs npm redis-server\n" +
		"deps: install them with: sudo apt-get install -y curl nodejs npm redis-server\n"
	if rc != 1 || stderr != want {
		t.Fatalf("deps.sh test: rc %d, stderr\n%s\nwant\n%s", rc, stderr, want)
	}
	rc, stderr = runDeps(t, path, "demo")
	if rc != 1 || !strings.Contains(stderr, "missing: curl\n") || !strings.Contains(stderr, "sudo apt-get install -y curl\n") {
		t.Fatalf("deps.sh demo: rc %d, stderr %q", rc, stderr)
	}
}

// Without pkg-config (so libzmq cannot be found by cgo either) or without Go, the build
// stops with what to install; an unknown target is a usage error.
func TestDepsBuildMissing(t *testing.T) {
	rc, stderr := runDeps(t, depsPath(t, "go"), "build")
	if rc != 1 || !strings.Contains(stderr, "sudo apt-get install -y pkg-config libzmq3-dev\n") {
		t.Fatalf("without pkg-config: rc %d, stderr %q", rc, stderr)
	}
	rc, stderr = runDeps(t, depsPath(t), "build")
	if rc != 1 || !strings.Contains(stderr, "Go ≥ 1.26") {
		t.Fatalf("without go: rc %d, stderr %q", rc, stderr)
	}
	rc, stderr = runDeps(t, depsPath(t, "go"), "bench")
	if rc != 2 || !strings.Contains(stderr, `unknown target "bench"`) {
		t.Fatalf("unknown target: rc %d, stderr %q", rc, stderr)
	}
}

// The Makefile asks deps.sh for each target's own packages: build for build, test for
// test (what .ci/run runs as root on a fresh machine, installing everything).
func TestMakefileDepsTargets(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	for target, want := range map[string]string{"build": "scripts/deps.sh build", "test": "scripts/deps.sh test",
		"demo": "scripts/deps.sh demo"} {
		out, err := exec.Command("make", "-C", "..", "-n", target).CombinedOutput()
		if err != nil {
			t.Fatalf("make -n %s: %v\n%s", target, err, out)
		}
		got := string(out)
		if !strings.Contains(got, want+"\n") {
			t.Errorf("make -n %s does not run %q:\n%s", target, want, got)
		}
		if target == "build" && strings.Contains(got, "deps.sh test") {
			t.Errorf("make build runs the test dependencies:\n%s", got)
		}
	}
}
