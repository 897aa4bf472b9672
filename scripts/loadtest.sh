#!/usr/bin/env bash
# make loadtest: what kvroute itself adds to time to first token, on loopback.
# 3 echo workers (vllm-sim --echo: zero engine time, instant SSE), kvroute in front of
# them with the local Qwen3 tokenizer, and kvbench --load sending the same streaming chat
# bodies straight to the workers (round robin) and through kvroute, at each concurrency
# and body size: added TTFT = kvroute's percentile − direct's, and kvroute's CPU seconds
# per request from /proc/PID/stat. Fronts: `kvroute proxy`, and `kvroute serve` behind
# the Envoy stand-in (cmd/envoy-standin; LOAD_FRONTS=proxy skips it).
#
# The load generator, the workers and kvroute share this machine's cores: on a small
# machine the figures include their contention (say so when quoting them).
#
# Knobs: LOAD_CONCURRENCY (1,50,200), LOAD_BODIES (4k,220k), LOAD_REQUESTS (400),
# LOAD_SHAPE (repeat: 16 distinct bodies cycled; next-turn: each request an agent's next
# call, its conversation's previous request plus an answer and a new user message),
# LOAD_FRONTS (proxy,serve), LOAD_OUT (load-out), LOAD_PORT (first of 7 ports),
# LOAD_TOKENIZER (.cache/tokenizers/qwen3; "" = no local tokenizer: remote /tokenize).
set -euo pipefail
cd "$(dirname "$0")/.."
LIB_NAME=loadtest PORT_ENV=${LOAD_PORT:-}
. scripts/lib.sh
OUT=${LOAD_OUT:-load-out}
CONC=${LOAD_CONCURRENCY:-1,50,200}
BODIES=${LOAD_BODIES:-4k,220k}
REQUESTS=${LOAD_REQUESTS:-400}
SHAPE=${LOAD_SHAPE:-repeat}
FRONTS=${LOAD_FRONTS:-proxy,serve}
TOK=${LOAD_TOKENIZER-.cache/tokenizers/qwen3}
MODEL=Qwen/Qwen3-8B

for b in vllm-sim kvroute kvbench envoy-standin; do
  [ -x "$BIN/$b" ] || { echo "loadtest: $BIN/$b missing; run make build" >&2; exit 1; }
done
[ -z "$TOK" ] || [ -f "$TOK/tokenizer.json" ] || { echo "loadtest: $TOK/tokenizer.json missing; run make tokenizers (or LOAD_TOKENIZER=)" >&2; exit 1; }

find_ports 7 21000
HTTP=$base PROXY=$((base + 3)) ADMIN=$((base + 4)) EXTPROC=$((base + 5)) ENVOY=$((base + 6))

# The workers' POST /tokenize uses the same tokenizer, so kvroute's shadow check agrees
# and its local path stays on (with the stand-in tokenizer it would switch to remote).
start_workers 3 "$HTTP" --echo --kv-port 0 --kv-replay-port 0 --model "$MODEL" ${TOK:+--tokenizer "$TOK"}
{
  echo "server:"
  echo "  proxy_addr: 127.0.0.1:$PROXY"
  echo "  admin_addr: 127.0.0.1:$ADMIN"
  echo "  ext_proc_addr: 127.0.0.1:$EXTPROC"
  echo "models:"
  echo "  - name: $MODEL"
  echo "    block_size: 16"
  [ -z "$TOK" ] || echo "    tokenizer: $TOK"
  echo "workers:"
  for i in 0 1 2; do
    echo "  - {name: echo-$i, address: \"127.0.0.1:$((HTTP + i))\"}"
  done
} >"$tmp/kvroute.yaml"
direct="direct=round_robin:http://127.0.0.1:$HTTP,http://127.0.0.1:$((HTTP + 1)),http://127.0.0.1:$((HTTP + 2))"
mkdir -p "$OUT"

run_front() { # name cmd url
  local name=$1 cmd=$2 url=$3
  "$BIN/kvroute" "$cmd" --config "$tmp/kvroute.yaml" 2>"$tmp/kvroute-$name.log" &
  local kp=$!
  pids+=($kp)
  wait_http "http://127.0.0.1:$ADMIN/healthz" 200
  if [ "$name" = serve ]; then
    "$BIN/envoy-standin" --listen "127.0.0.1:$ENVOY" --ext-proc "127.0.0.1:$EXTPROC" 2>"$tmp/standin.log" &
    pids+=($!)
    sleep 0.5
  fi
  echo "loadtest: $name ($cmd), concurrency $CONC, bodies $BODIES ($SHAPE), $REQUESTS requests per point"
  "$BIN/kvbench" --load --http "$direct" --http "kvroute-$name=$url" --router-pid "$kp" --model "$MODEL" \
    --concurrency "$CONC" --body-sizes "$BODIES" --load-requests "$REQUESTS" --load-shape "$SHAPE" --out "$OUT/$name"
  kill "$kp" 2>/dev/null || true
  wait "$kp" 2>/dev/null || true
}
case ",$FRONTS," in *,proxy,*) run_front proxy proxy "http://127.0.0.1:$PROXY" ;; esac
case ",$FRONTS," in *,serve,*) run_front serve serve "http://127.0.0.1:$ENVOY" ;; esac
