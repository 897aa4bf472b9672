#!/usr/bin/env bash
# make bench: the routing-quality scoreboard in kvbench's virtual time.
# Every workload of bench.ScoreboardRows — shared prefix uniform and hot (Zipf 1.2) at
# 1-4 req/s, multi-turn light to saturated, the Mooncake trace at 1x/2x/3x (when
# $TRACE exists), a heterogeneous pool, a mid-run slowdown, the GuideLLM-like closed
# loop — with every policy, 5 seeds (15 where seed-sensitive). Prints kvroute / best peer per
# row, writes bench-out/scoreboard.{md,json}, and regenerates the scoreboard section of
# BENCHMARKS.md between its markers (BENCH_DOC= to leave it alone).
# Knobs: BENCH_ROWS (regexp of row keys), BENCH_SEEDS (override every row's seeds),
# BENCH_TRACE_SEEDS (Mooncake rows, default 1), BENCH_PARALLEL (concurrent runs, default
# the number of CPUs), BENCH_POLICIES (comma list, default all).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
OUT=${BENCH_OUT:-bench-out}
TRACE=${TRACE:-bench/traces/mooncake_conversation_trace.jsonl.gz}
DOC=${BENCH_DOC-BENCHMARKS.md}
args=(--scoreboard --trace "$TRACE" --out "$OUT" --policies "${BENCH_POLICIES:-all}" --trace-seeds "${BENCH_TRACE_SEEDS:-1}")
[ -n "${BENCH_ROWS:-}" ] && args+=(--rows "$BENCH_ROWS")
[ -n "${BENCH_SEEDS:-}" ] && args+=(--seeds "$BENCH_SEEDS")
[ -n "${BENCH_PARALLEL:-}" ] && args+=(--parallel "$BENCH_PARALLEL")
[ -n "$DOC" ] && args+=(--doc "$DOC")
[ -f "$TRACE" ] || echo "== Mooncake trace not found at $TRACE: its rows are skipped (set TRACE=FILE)"
"$BIN/kvbench" "${args[@]}"
