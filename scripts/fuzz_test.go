// Package scripts_test checks the shell scripts behind the Makefile's targets where their
// logic has branches of its own (scripts/fuzz.sh's verdict on a failed fuzz target).
package scripts_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeGo is a stand-in for the go command, as scripts/fuzz.sh calls it: `go list PKGS`
// names one package, `go test PKG -list ^Fuzz` names its targets, `go test PKG -run ^$
// -fuzz ^NAME$ ...` prints what the real fuzzing coordinator prints for NAME (from the
// FUZZOUT_NAME file, exit 1 when the file exists), and `go test PKG -run ^NAME$` (the
// corpus replay) exits with the code in REPLAYRC_NAME (0 when absent). The Go fuzzing
// coordinator's deadline race (go.dev/issue/75804) cannot be made to happen on demand, so
// its output, copied from a CI log, is replayed here.
const fakeGo = `#!/usr/bin/env bash
dir=$(dirname "$0")
case "$1" in
list) echo example.com/p ;;
test)
  args="$*"
  if [[ "$args" == *"-list"* ]]; then printf 'FuzzRace\nFuzzCrash\nFuzzClean\nok\n'; exit 0; fi
  if [[ "$args" =~ -fuzz\ \^(Fuzz[A-Za-z]*)\$ ]]; then
    n=${BASH_REMATCH[1]}
    if [ -f "$dir/FUZZOUT_$n" ]; then cat "$dir/FUZZOUT_$n"; exit 1; fi
    echo "fuzz: elapsed: 2s, execs: 2000 (1000/sec), new interesting: 0 (total: 9)"; echo PASS; exit 0
  fi
  if [[ "$args" =~ -run\ \^(Fuzz[A-Za-z]*)\$ ]]; then
    n=${BASH_REMATCH[1]}
    echo "$n" >>"$dir/replayed"
    exit "$(cat "$dir/REPLAYRC_$n" 2>/dev/null || echo 0)"
  fi
  echo "fake go: unexpected: $args" >&2; exit 2 ;;
esac
`

// deadlineRace is what go test -fuzz printed in the CI run that failed on the
// coordinator's race: no crasher, a bare context error.
const deadlineRace = `fuzz: elapsed: 3s, execs: 6427 (2142/sec), new interesting: 14 (total: 111)
fuzz: elapsed: 5s, execs: 6427 (0/sec), new interesting: 14 (total: 111)
--- FAIL: FuzzRace (5.02s)
    context deadline exceeded
FAIL
exit status 1
`

// crasher is what go test -fuzz prints on a real finding.
const crasher = `--- FAIL: FuzzCrash (0.31s)
    --- FAIL: FuzzCrash (0.00s)
        testing.go:1591: panic: runtime error: index out of range [3] with length 3
    Failing input written to testdata/fuzz/FuzzCrash/5f0e6e3a1b
    To re-run:
    go test -run=FuzzCrash/5f0e6e3a1b
FAIL
`

func runFuzzScript(t *testing.T, fuzzOut map[string]string, replayRC map[string]string) (string, int, string) {
	t.Helper()
	dir := t.TempDir()
	goBin := filepath.Join(dir, "go")
	if err := os.WriteFile(goBin, []byte(fakeGo), 0o755); err != nil {
		t.Fatal(err)
	}
	for n, out := range fuzzOut {
		if err := os.WriteFile(filepath.Join(dir, "FUZZOUT_"+n), []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for n, rc := range replayRC {
		if err := os.WriteFile(filepath.Join(dir, "REPLAYRC_"+n), []byte(rc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("bash", "fuzz.sh")
	cmd.Env = append(os.Environ(), "GO="+goBin, "FUZZTIME=4s", "FUZZ_PKGS=./...")
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	replayed, _ := os.ReadFile(filepath.Join(dir, "replayed"))
	return string(out), code, strings.TrimSpace(string(replayed))
}

func TestFuzzScriptToleratesCoordinatorDeadlineRace(t *testing.T) {
	out, code, replayed := runFuzzScript(t, map[string]string{"FuzzRace": deadlineRace}, nil)
	if code != 0 {
		t.Fatalf("exit %d, want 0 (a bare deadline whose corpus replays clean is not a finding):\n%s", code, out)
	}
	if replayed != "FuzzRace" {
		t.Errorf("replayed %q, want only FuzzRace's corpus", replayed)
	}
	for _, want := range []string{
		"example.com/p FuzzRace ok (coordinator deadline race, corpus replay passed)",
		"example.com/p FuzzClean ok execs=2000",
		"3 targets, 0 failed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestFuzzScriptFailsOnCrasherEvenWithDeadline(t *testing.T) {
	// A real finding fails the run, and so does a bare deadline whose corpus replay fails
	// (then the message may hide a slow or hanging input, not the coordinator's race).
	out, code, replayed := runFuzzScript(t,
		map[string]string{"FuzzRace": deadlineRace, "FuzzCrash": crasher + "    context deadline exceeded\n"},
		map[string]string{"FuzzRace": "1"})
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	if replayed != "FuzzRace" {
		t.Errorf("replayed %q, want only FuzzRace (a written crasher is never replayed away)", replayed)
	}
	for _, want := range []string{
		"example.com/p FuzzRace FAILED",
		"example.com/p FuzzCrash FAILED",
		"Failing input written to testdata/fuzz/FuzzCrash/5f0e6e3a1b",
		"3 targets, 2 failed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
