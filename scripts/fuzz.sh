#!/usr/bin/env bash
# Runs every Go fuzz target in the module, one at a time, for FUZZTIME each.
#   FUZZTIME=4s scripts/fuzz.sh        # what `make test` runs (seed corpus + a few seconds)
#   FUZZTIME=5m scripts/fuzz.sh        # `make fuzz`
#   FUZZ_PKGS=./extproc/... scripts/fuzz.sh   # only some packages
# Targets are discovered with `go test -list '^Fuzz'`, so a new func FuzzXxx in any
# package is picked up without editing this script. A failing target leaves its crasher
# in the package's testdata/fuzz/FuzzXxx/ (commit it as a regression seed once fixed);
# the script runs every target and exits non-zero if any failed.
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
    else
      cat "$log"
      failed+=("$pkg $name")
      summary+=("$pkg $name FAILED")
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
