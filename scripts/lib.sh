# scripts/lib.sh: the start-up shared by scripts/demo.sh and scripts/loadtest.sh, sourced
# (not run). Set LIB_NAME (the prefix of messages) before sourcing. Provides:
#   find_ports N LOW   sets base: the first of N free consecutive loopback ports at or
#                      above LOW (below Linux's ephemeral ports, 32768+, which outgoing
#                      connections may hold); $PORT_ENV, when set, is taken as it is
#   tmp, pids          a temp dir (logs, config) and the started processes, both
#                      cleaned up (processes killed, then waited for) on exit
#   wait_http URL [T]  polls URL until it answers 2xx, T tries 0.1 s apart (100); on
#                      timeout prints every log in $tmp and exits 1
#   start_workers N PORT ARGS...  starts N simulated vLLM workers (bin/vllm-sim, one
#                      process) on 127.0.0.1:PORT..PORT+N-1 with ARGS, logging to
#                      $tmp/vllm-sim.log, and waits until each answers /health
LIB_NAME=${LIB_NAME:-script}
BIN=${BIN:-bin}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

find_ports() { # n low
  local n=$1 low=$2 cand ok i
  base=${PORT_ENV:-}
  if [ -z "$base" ]; then
    for _ in $(seq 1 50); do
      cand=$(( low + (RANDOM % 1000) * 10 ))
      ok=1
      for i in $(seq 0 $((n - 1))); do port_free $((cand + i)) || { ok=0; break; }; done
      [ $ok = 1 ] && { base=$cand; break; }
    done
  fi
  [ -n "$base" ] || { echo "$LIB_NAME: no free port range found" >&2; exit 1; }
}

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

wait_http() { # url [tries]
  for _ in $(seq 1 "${2:-100}"); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "$LIB_NAME: $1 did not come up; logs:" >&2
  cat "$tmp"/*.log >&2
  exit 1
}

start_workers() { # n port args...
  local n=$1 port=$2 i
  shift 2
  "$BIN/vllm-sim" --workers "$n" --host 127.0.0.1 --port "$port" "$@" 2>"$tmp/vllm-sim.log" &
  pids+=($!)
  for i in $(seq 0 $((n - 1))); do wait_http "http://127.0.0.1:$((port + i))/health" 200; done
}
