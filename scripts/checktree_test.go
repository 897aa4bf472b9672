package scripts_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// checkTree runs scripts/check-tree.sh over a fresh git work tree holding files, and
// returns its exit code and standard error.
func checkTree(t *testing.T, files map[string][]byte) (int, string) {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"init", "-q"}, {"add", "-A"}} {
		if out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	script, err := filepath.Abs("check-tree.sh")
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command("bash", script, dir)
	cmd.Stderr = &stderr
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), stderr.String()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, stderr.String()
}

func TestCheckTree(t *testing.T) {
	clean := func() map[string][]byte {
		return map[string][]byte{
			"README.md":         []byte("# x\n\nRun `make test`.\n"),
			"BENCHMARKS.md":     []byte("# results\n\n`make bench` writes bench-out/.\n"),
			"docs/guide.md":     []byte("See [the README](../README.md).\n"),
			"pkg/testdata/a.gz": bytes.Repeat([]byte{1}, 1000),
		}
	}
	if rc, stderr := checkTree(t, clean()); rc != 0 {
		t.Fatalf("clean tree failed (rc %d): %s", rc, stderr)
	}
	for _, c := range []struct {
		name, file string
		body       []byte
		want       string
	}{
		{"binary at the root", "kvbench", append([]byte{0x7f, 'E', 'L', 'F'}, make([]byte, 64)...), "executable binary"},
		{"binary deep down", "tools/x/run.exe", append([]byte("MZ"), make([]byte, 64)...), "executable binary"},
		{"large file", "data/big.bin", make([]byte, 1<<20+1), "over 1048576"},
		{"long README", "README.md", []byte(strings.Repeat("line\n", 251)), "README.md has 251 lines"},
		{"long BENCHMARKS", "BENCHMARKS.md", []byte(strings.Repeat("line\n", 501)), "BENCHMARKS.md has 501 lines"},
		{"machine path", "docs/bench/methods.md", []byte("go test -c -o /tmp/kv.test ./kvindex/\n"), "machine paths"},
		{"home path", "README.md", []byte("edit /home/me/kvroute.yaml\n"), "machine paths"},
		{"shared path", "BENCHMARKS.md", []byte("kvbench --trace ../shared/data/t.jsonl\n"), "machine paths"},
	} {
		t.Run(c.name, func(t *testing.T) {
			files := clean()
			files[c.file] = c.body
			rc, stderr := checkTree(t, files)
			if rc == 0 || !strings.Contains(stderr, c.want) {
				t.Fatalf("rc %d, stderr %q; want a failure naming %q", rc, stderr, c.want)
			}
		})
	}
}
