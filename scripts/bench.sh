#!/usr/bin/env bash
# make bench: virtual-time comparison of kvroute against every baseline policy.
#  1. shared prefix (GuideLLM-style: 8 system prompts of 6,000 tokens, 200-token user
#     suffix, 64 output tokens) on 3 simulated L40S / 27B FP8 workers at five Poisson
#     rates, from unsaturated (0.5 req/s) to past the baselines' saturation (4 req/s);
#  2. the same with hot prefixes (16 prefixes drawn from a Zipf law, s = 1.2), where
#     cache affinity without a load term overloads the worker holding the hottest one;
#  3. the Mooncake conversation trace on 8 simulated H100 / 8B workers, when
#     ../shared/data/traces is present: its first BENCH_TRACE_DURATION (default 20m;
#     0 = the whole hour, ~1.5 min per policy here) as recorded, then the same
#     20 minutes replayed twice as fast (--speed 2 --max-duration 10m) for a loaded point.
# Results: bench-out/<workload>/report.json and SVG plots; tables on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
OUT=${BENCH_OUT:-bench-out}
TRACE=${TRACE:-../shared/data/traces/mooncake_conversation_trace.jsonl}
POLICIES=${BENCH_POLICIES:-all}

echo "== shared prefix, 3 x l40s-27b, virtual time"
"$BIN/kvbench" --workload shared-prefix --requests 600 --prefixes 8 --prefix-tokens 6000 --suffix-tokens 200 \
  --output-tokens 64 --sweep poisson:0.5,1,2,3,4 --workers 3 --profile l40s-27b --policies "$POLICIES" \
  --out "$OUT/shared-prefix"

echo "== shared prefix with hot prefixes (16 prefixes, Zipf 1.2), 3 x l40s-27b, virtual time"
"$BIN/kvbench" --workload shared-prefix --requests 600 --prefixes 16 --prefix-skew 1.2 --prefix-tokens 6000 \
  --suffix-tokens 200 --output-tokens 64 --sweep poisson:1,2,3 --workers 3 --profile l40s-27b --policies "$POLICIES" \
  --out "$OUT/shared-prefix-skewed"

if [ -f "$TRACE" ]; then
  echo "== Mooncake conversation trace, 8 x h100-8b, virtual time"
  "$BIN/kvbench" --workload trace --trace "$TRACE" --workers 8 --profile h100-8b --policies "$POLICIES" \
    --max-duration "${BENCH_TRACE_DURATION:-20m}" --out "$OUT/mooncake"
  echo "== Mooncake conversation trace at twice its speed (its first 20 minutes in 10), 8 x h100-8b, virtual time"
  "$BIN/kvbench" --workload trace --trace "$TRACE" --workers 8 --profile h100-8b --policies "$POLICIES" \
    --max-duration 10m --speed 2 --out "$OUT/mooncake-x2"
else
  echo "== Mooncake trace not found at $TRACE: skipped (set TRACE=FILE)"
fi
