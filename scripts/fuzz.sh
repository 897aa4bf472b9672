#!/usr/bin/env bash
# Runs every Go fuzz target in the module, one at a time, for FUZZTIME each.
#   FUZZTIME=2000x scripts/fuzz.sh     # what `make test` runs (seed corpus + 2,000 executions)
#   FUZZTIME=5m scripts/fuzz.sh        # `make fuzz`
#   FUZZ_PKGS=./extproc/... scripts/fuzz.sh   # only some packages
# Targets are discovered with `go test -list '^Fuzz'`, so a new func FuzzXxx in any
# package is picked up without editing this script. A failing target leaves its crasher
# in the package's testdata/fuzz/FuzzXxx/ (commit it as a regression seed once fixed);
# the script runs every target and exits non-zero if any failed.
#
# A duration budget (5m) races Go's fuzzing coordinator: when the deadline fires while a
# worker is mid-call (likely on a loaded machine), `go test -fuzz` fails with a bare
# "context deadline exceeded" and writes no crasher (https://go.dev/issue/75804). An
# execution count (2000x) sets no deadline, so `make test` uses one. For a duration run,
# a failure whose output is that bare message with no "Failing input written to" is
# checked by replaying the target's seed corpus and committed crashers (`go test -run`):
# if that passes, the target counts as ok and the summary says why.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-5m}
PKGS=${FUZZ_PKGS:-./...}
failed=()
total=0
summary=()
for pkg in $($GO list $PKGS); do
  targets=$($GO test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true)
  for name in $targets; do
    total=$((total + 1))
    echo "fuzz: $pkg $name ($FUZZTIME)"
    log=$(mktemp)
    if $GO test "$pkg" -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -v >"$log" 2>&1; then
      execs=$(grep -o 'execs: [0-9]*' "$log" | tail -1 | awk '{print $2}' || true)
      summary+=("$pkg $name ok execs=${execs:-?}")
    elif grep -q '^    context deadline exceeded$' "$log" && ! grep -q 'Failing input written to' "$log" &&
      $GO test "$pkg" -run "^${name}\$" -count=1 >"$log.replay" 2>&1; then
      echo "fuzz: $pkg $name: bare 'context deadline exceeded' at the end of -fuzztime, no crasher; corpus replay passed (go.dev/issue/75804)"
      summary+=("$pkg $name ok (coordinator deadline race, corpus replay passed)")
      rm -f "$log.replay"
    else
      cat "$log"
      [ -f "$log.replay" ] && cat "$log.replay"
      failed+=("$pkg $name")
      summary+=("$pkg $name FAILED")
      rm -f "$log.replay"
    fi
    rm -f "$log"
  done
done
printf 'fuzz: %s\n' "${summary[@]}"
echo "fuzz: $total targets, ${#failed[@]} failed (FUZZTIME=$FUZZTIME)"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'fuzz: FAILED %s\n' "${failed[@]}"
  exit 1
fi
