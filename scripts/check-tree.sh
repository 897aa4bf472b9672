#!/usr/bin/env bash
# scripts/check-tree.sh [DIR]: the repository stays one a newcomer can clone and read
# (run by `make test`, so CI enforces it). DIR is a git work tree, by default this one.
# Fails, naming each offender, on:
#   - a tracked file over 1 MiB that is not in ALLOW_LARGE below;
#   - a tracked executable binary (ELF, Mach-O, PE), anywhere;
#   - README.md over 250 lines or BENCHMARKS.md over 500 lines;
#   - an absolute machine path (/work/, /root/, /home/, /tmp/, /Users/) or a path into
#     ../shared in README.md, BENCHMARKS.md, CONTRIBUTING.md or docs/: every command a
#     reader is told to run must work from a clean clone;
#   - a Go file outside tests over 600 lines (generated files, marked "Code generated
#     ... DO NOT EDIT.", excepted): split it by what each part owns;
#   - a Go file outside tests that cites an issue number or ../shared in place of the
#     upstream source (a vLLM file, an Envoy doc, a paper) or the reason itself.
set -uo pipefail
dir=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$dir" || exit 2

MAX_BYTES=$((1 << 20))
# Tracked files allowed over MAX_BYTES (test data named one per line; none today).
ALLOW_LARGE=""

fail=0
bad() { echo "check-tree: $*" >&2; fail=1; }

while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue
  size=$(stat -c %s -- "$f")
  if [ "$size" -gt "$MAX_BYTES" ] && ! grep -qxF -- "$f" <<<"$ALLOW_LARGE"; then
    bad "$f is $size bytes (over $MAX_BYTES; add it to ALLOW_LARGE in scripts/check-tree.sh only if it is test data)"
  fi
  magic=$(head -c 4 -- "$f" | od -An -tx1 | tr -d ' \n')
  case "$magic" in
    7f454c46|cffaedfe|cefaedfe|feedface|feedfacf|4d5a*)
      bad "$f is an executable binary (magic $magic): build outputs belong in bin/, which git ignores" ;;
  esac
done < <(git ls-files -z)

lines() { [ -f "$1" ] && wc -l <"$1" || echo 0; }
[ "$(lines README.md)" -le 250 ] || bad "README.md has $(lines README.md) lines (at most 250: the rest belongs in docs/)"
[ "$(lines BENCHMARKS.md)" -le 500 ] || bad "BENCHMARKS.md has $(lines BENCHMARKS.md) lines (at most 500: methods belong in docs/benchmarks/)"

docs=$(git ls-files -- README.md BENCHMARKS.md CONTRIBUTING.md 'docs/*.md' 'docs/**/*.md' | sort -u)
if [ -n "$docs" ]; then
  # shellcheck disable=SC2086
  hits=$(grep -nE "(^|[[:space:](\`'\"=:])(/(work|root|home|tmp|Users)/|\.\./shared)" $docs)
  if [ -n "$hits" ]; then
    bad "machine paths or ../shared in documents (use repository-relative paths):"
    echo "$hits" | sed 's/^/  /' >&2
  fi
fi

MAX_GO_LINES=600
while IFS= read -r f; do
  [ -f "$f" ] || continue
  head -c 4096 -- "$f" | grep -qE '^// Code generated .* DO NOT EDIT\.$' && continue
  n=$(wc -l <"$f")
  [ "$n" -le "$MAX_GO_LINES" ] || bad "$f has $n lines (a Go file outside tests holds at most $MAX_GO_LINES: split it by what each part owns)"
  if hits=$(grep -nE '[Ii]ssues? #?[0-9]+|\.\./shared' -- "$f"); then
    bad "$f cites an issue or ../shared (cite the upstream source or say it in place):"
    echo "$hits" | sed 's/^/  /' >&2
  fi
done < <(git ls-files -- '*.go' | grep -v '_test\.go$')

[ "$fail" -eq 0 ] && echo "check-tree: ok"
exit "$fail"
