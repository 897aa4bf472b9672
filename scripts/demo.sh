#!/usr/bin/env bash
# make demo: 3 simulated vLLM workers (L40S / 27B FP8 profile, real HTTP on 127.0.0.1 and
# real ZMQ KV events), kvroute in front of them (`kvroute proxy`, no Envoy needed), and a
# shared-prefix workload sent through kvroute, through random routing (a Kubernetes
# Service) and through round robin. Everything listens on loopback and is stopped on exit.
#
# Knobs (environment): DEMO_REQUESTS, DEMO_RATE (req/s), DEMO_PREFIXES, DEMO_PREFIX_TOKENS,
# DEMO_SUFFIX_TOKENS, DEMO_OUTPUT_TOKENS, DEMO_OUT (output directory), DEMO_PORT (first port).
set -euo pipefail
cd "$(dirname "$0")/.."
LIB_NAME=demo PORT_ENV=${DEMO_PORT:-}
. scripts/lib.sh
OUT=${DEMO_OUT:-demo-out}
REQUESTS=${DEMO_REQUESTS:-72}
RATE=${DEMO_RATE:-2.5}
PREFIXES=${DEMO_PREFIXES:-8}
PREFIX_TOKENS=${DEMO_PREFIX_TOKENS:-6000}
SUFFIX_TOKENS=${DEMO_SUFFIX_TOKENS:-200}
OUTPUT_TOKENS=${DEMO_OUTPUT_TOKENS:-48}

for b in vllm-sim kvroute kvbench; do
  [ -x "$BIN/$b" ] || { echo "demo: $BIN/$b missing; run make build" >&2; exit 1; }
done

# 11 free ports in a row: 3 HTTP, 3 PUB, 3 replay, proxy, admin
find_ports 11 20000
HTTP=$base KV=$((base + 3)) REPLAY=$((base + 6)) PROXY=$((base + 9)) ADMIN=$((base + 10))

echo "demo: starting 3 simulated vLLM workers (profile l40s-27b) on 127.0.0.1:$HTTP-$((HTTP + 2))"
start_workers 3 "$HTTP" --kv-port "$KV" --kv-replay-port "$REPLAY" \
  --profile l40s-27b --enable-prompt-tokens-details --default-max-tokens "$OUTPUT_TOKENS"

MODEL=google/gemma-3-27b-it
{
  echo "server:"
  echo "  proxy_addr: 127.0.0.1:$PROXY"
  echo "  admin_addr: 127.0.0.1:$ADMIN"
  echo "proxy:"
  echo "  paths: [/v1/chat/completions, /v1/completions, /v1/models, /v1/messages]  # vllm-sim serves Anthropic's too"
  echo "models:"
  echo "  - name: $MODEL"
  echo "    block_size: 16"
  echo "workers:"
  for i in 0 1 2; do
    echo "  - name: sim-$i"
    echo "    address: 127.0.0.1:$((HTTP + i))"
    echo "    kv_events: {endpoint: \"tcp://127.0.0.1:$((KV + i))\", replay_endpoint: \"tcp://127.0.0.1:$((REPLAY + i))\"}"
    echo "    profile: {prefill_tokens_per_second: 3000, decode_tokens_per_second: 30, overhead: 40ms, block_capacity: 2048}"
  done
} >"$tmp/kvroute.yaml"
echo "demo: starting kvroute proxy on 127.0.0.1:$PROXY (config $tmp/kvroute.yaml)"
"$BIN/kvroute" proxy --config "$tmp/kvroute.yaml" 2>"$tmp/kvroute.log" &
pids+=($!)

wait_http "http://127.0.0.1:$ADMIN/healthz"

# One tiny request through kvroute first: fail early and clearly if the proxy cannot route.
if ! curl -fsS -o "$tmp/probe.json" -H 'Content-Type: application/json' \
    -d "{\"model\":\"google/gemma-3-27b-it\",\"prompt\":[1,2,3],\"max_tokens\":1}" "http://127.0.0.1:$PROXY/v1/completions"; then
  echo "demo: kvroute proxy did not route a probe request; kvroute log:" >&2
  tail -20 "$tmp/kvroute.log" >&2
  exit 1
fi

# One Anthropic Messages call (streamed), as the official SDK sends it: vLLM's event
# sequence comes back through kvroute, with usage on message_start and message_delta.
if ! curl -fsS -N -o "$tmp/anthropic.sse" -H 'Content-Type: application/json' -H 'anthropic-version: 2023-06-01' \
    -d "{\"model\":\"$MODEL\",\"max_tokens\":8,\"stream\":true,\"system\":\"You are terse.\",\"messages\":[{\"role\":\"user\",\"content\":\"Say hello.\"}]}" \
    "http://127.0.0.1:$PROXY/v1/messages"; then
  echo "demo: the Anthropic call through kvroute failed; kvroute log:" >&2
  tail -20 "$tmp/kvroute.log" >&2
  exit 1
fi
echo "demo: one Anthropic call (POST /v1/messages, stream) through kvroute; events:"
echo "demo:   $(sed -n 's/^event: //p' "$tmp/anthropic.sse" | paste -sd' ' -)"
echo "demo:   message_delta: $(grep -A1 '^event: message_delta' "$tmp/anthropic.sse" | sed -n 's/^data: //p')"

urls="http://127.0.0.1:$HTTP,http://127.0.0.1:$((HTTP + 1)),http://127.0.0.1:$((HTTP + 2))"
metrics="http://127.0.0.1:$HTTP/metrics,http://127.0.0.1:$((HTTP + 1))/metrics,http://127.0.0.1:$((HTTP + 2))/metrics"
echo "demo: shared prefix: $PREFIXES system prompts of $PREFIX_TOKENS tokens, $SUFFIX_TOKENS-token user suffix, $OUTPUT_TOKENS output tokens;"
echo "demo: $REQUESTS requests, Poisson $RATE req/s, through kvroute, random and round robin (caches reset between runs)"
"$BIN/kvbench" --workload shared-prefix --requests "$REQUESTS" --prefixes "$PREFIXES" --prefix-tokens "$PREFIX_TOKENS" \
  --suffix-tokens "$SUFFIX_TOKENS" --output-tokens "$OUTPUT_TOKENS" --arrivals "poisson:$RATE" --model "$MODEL" \
  --http "kvroute=http://127.0.0.1:$PROXY" --http "random=random:$urls" --http "round_robin=round_robin:$urls" \
  --reset "$urls" --worker-metrics "$metrics" --out "$OUT"
