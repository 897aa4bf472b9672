#!/usr/bin/env bash
# Fetches the official OpenAI (npm `openai`) and Anthropic (npm `@anthropic-ai/sdk`)
# JavaScript SDKs for the SDK e2e test (e2e/sdk_test.go) into .cache/sdk/, with `npm ci`
# from e2e/testdata/sdk/package.json (exact versions) and its package-lock.json (every
# transitive package pinned, integrity-checked).
#
# Idempotent and offline-friendly: when .cache/sdk holds the same lock file and both SDKs,
# nothing is fetched. Nothing fetched here is committed (.cache/ is git-ignored).
# Called by scripts/deps.sh test (so `make test` and CI have the SDKs).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
src="$root/e2e/testdata/sdk"
dest="$root/.cache/sdk"
if cmp -s "$src/package-lock.json" "$dest/package-lock.json" 2>/dev/null &&
   [ -s "$dest/node_modules/openai/package.json" ] && [ -s "$dest/node_modules/@anthropic-ai/sdk/package.json" ]; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "fetch-sdks: npm is not installed; it is needed to fetch the OpenAI and Anthropic SDKs" >&2
  echo "fetch-sdks: install it with scripts/deps.sh test (Debian: apt-get install -y nodejs npm)" >&2
  exit 1
fi
echo "fetch-sdks: npm ci (openai, @anthropic-ai/sdk as pinned in e2e/testdata/sdk/package-lock.json)" >&2
mkdir -p "$dest"
cp "$src/package.json" "$src/package-lock.json" "$dest/"
if ! (cd "$dest" && npm ci --silent --no-audit --no-fund --ignore-scripts >/dev/null); then
  rm -f "$dest/package-lock.json" # so that the next run tries again
  echo "fetch-sdks: npm ci failed (network or registry unreachable?)" >&2
  exit 1
fi
