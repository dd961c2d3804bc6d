#!/usr/bin/env bash
# Baseline benchmark: mcpo (MCP -> OpenAPI proxy) in front of
# @modelcontextprotocol/server-everything over stdio, bound to 127.0.0.1 only.
#
# Usage: bench/mcpo/run.sh [PORT]        (default: a free ephemeral port)
# Env:   BENCH_SECONDS  wrk duration per connection count (default 10)
#        BENCH_SEQ      sequential requests for the latency percentiles (default 2000)
#        BENCH_CONNS    wrk connection counts (default "1 16 64")
# Needs: bench/mcpo/setup.sh run first (.venv-bench with mcpo, wrk, node).
#
# Measures, calling the `echo` tool via mcpo's POST /echo:
#   * p50/p90/p99 latency of BENCH_SEQ sequential calls on one keep-alive
#     http.client connection (seq_client.py);
#   * requests/s from `wrk -t1 -cC -dD -s post.lua` for each C;
#   * CPU ms per call during each wrk run: utime+stime (from /proc/PID/stat) of
#     mcpo's python process and all its descendants (the node server), delta
#     over the run divided by the requests wrk reports;
#   * peak RSS (VmHWM) of mcpo and node at the end.
# Prints ONE JSON object on stdout; progress goes to stderr.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="$ROOT/.venv-bench"
EVERYTHING="$ROOT/tests/fixtures/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
HOST=127.0.0.1
SECONDS_PER_RUN="${BENCH_SECONDS:-10}"
SEQ_N="${BENCH_SEQ:-2000}"
CONNS="${BENCH_CONNS:-1 16 64}"
TICKS="$(getconf CLK_TCK)"

log() { printf 'bench/mcpo/run.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ -x "$VENV/bin/mcpo" ]] || die "missing $VENV/bin/mcpo; run bench/mcpo/setup.sh"
[[ -f "$EVERYTHING" ]] || die "missing $EVERYTHING; run bench/mcpo/setup.sh"
command -v wrk >/dev/null 2>&1 || die "missing wrk; run bench/mcpo/setup.sh"
command -v node >/dev/null 2>&1 || die "missing node"
[[ "$SECONDS_PER_RUN" =~ ^[0-9]+$ && "$SECONDS_PER_RUN" -ge 1 ]] || die "BENCH_SECONDS must be a positive integer"
[[ "$SEQ_N" =~ ^[0-9]+$ && "$SEQ_N" -ge 1 ]] || die "BENCH_SEQ must be a positive integer"

if [[ $# -ge 1 ]]; then
  PORT="$1"
else
  PORT="$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')"
fi
[[ "$PORT" =~ ^[0-9]+$ ]] || die "bad port: $PORT"
BASE="http://$HOST:$PORT"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/bench-mcpo.XXXXXX")"
MCPO_PID=""

# descendants PID -> all descendant pids (bounded depth), one per line
descendants() {
  local level=("$1") next depth kid
  for depth in 1 2 3 4 5; do
    next=()
    for p in "${level[@]}"; do
      while read -r kid; do
        [[ -n "$kid" ]] && next+=("$kid")
      done < <(pgrep -P "$p" 2>/dev/null || true)
    done
    [[ ${#next[@]} -eq 0 ]] && break
    printf '%s\n' "${next[@]}"
    level=("${next[@]}")
  done
}

stop_mcpo() {
  [[ -n "$MCPO_PID" ]] || return 0
  local pids i
  pids="$MCPO_PID $(descendants "$MCPO_PID" | tr '\n' ' ')"
  log "stopping mcpo (pids: $pids)"
  kill -TERM "$MCPO_PID" 2>/dev/null || true
  for i in $(seq 1 50); do
    kill -0 "$MCPO_PID" 2>/dev/null || break
    sleep 0.1
  done
  # anything left (mcpo or its node child) gets SIGKILL, by pid
  for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
  wait "$MCPO_PID" 2>/dev/null || true
  MCPO_PID=""
}
cleanup() {
  local rc=$?
  stop_mcpo
  if [[ $rc -ne 0 && -f "$WORK/mcpo.log" ]]; then
    log "mcpo log tail:"; tail -n 20 "$WORK/mcpo.log" >&2 || true
  fi
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# cpu_ticks PID... -> sum of utime+stime (fields 14,15 of /proc/PID/stat)
cpu_ticks() {
  local total=0 p stat rest
  for p in "$@"; do
    stat="$(cat "/proc/$p/stat" 2>/dev/null)" || continue
    rest="${stat##*) }"                  # fields from 3 on (comm may hold spaces)
    read -r -a f <<<"$rest"
    total=$((total + f[11] + f[12]))     # utime = field 14, stime = field 15
  done
  echo "$total"
}
hwm_kib() { awk '/^VmHWM:/ {print $2}' "/proc/$1/status"; }

log "starting mcpo on $BASE (server-everything over stdio)"
"$VENV/bin/mcpo" --host "$HOST" --port "$PORT" -- node "$EVERYTHING" stdio \
  >"$WORK/mcpo.log" 2>&1 </dev/null &
MCPO_PID=$!

ready=""
for _ in $(seq 1 300); do                 # up to ~60 s
  kill -0 "$MCPO_PID" 2>/dev/null || die "mcpo exited during startup"
  if curl -sf -o "$WORK/openapi.json" "$BASE/openapi.json" 2>/dev/null \
     && grep -q '"/echo"' "$WORK/openapi.json"; then
    ready=1; break
  fi
  sleep 0.2
done
[[ -n "$ready" ]] || die "mcpo not ready after 60 s"

resp="$(curl -sf -m 10 -X POST -H 'Content-Type: application/json' -d '{"message":"hello"}' "$BASE/echo")" \
  || die "POST /echo failed"
[[ "$resp" == *"Echo: hello"* ]] || die "unexpected /echo response: $resp"

NODE_PID="$(descendants "$MCPO_PID" | while read -r p; do
  [[ "$(cat "/proc/$p/comm" 2>/dev/null)" == node ]] && { echo "$p"; break; }; done || true)"
[[ -n "$NODE_PID" ]] || die "no node child under mcpo ($MCPO_PID)"
log "ready: mcpo pid $MCPO_PID, node pid $NODE_PID"

log "sequential: $SEQ_N calls"
seq_json="$(timeout 600 "$VENV/bin/python" "$HERE/seq_client.py" "$HOST" "$PORT" /echo "$SEQ_N")" \
  || die "sequential client failed"
log "sequential: $seq_json"

declare -A RPS CPU
for c in $CONNS; do
  pids=("$MCPO_PID" $(descendants "$MCPO_PID"))
  t0="$(cpu_ticks "${pids[@]}")"
  out="$(timeout $((SECONDS_PER_RUN + 60)) wrk -t1 -c "$c" -d "${SECONDS_PER_RUN}s" --timeout 10s \
         -s "$HERE/post.lua" "$BASE/echo")" || die "wrk -c $c failed"
  t1="$(cpu_ticks "${pids[@]}")"
  printf '%s\n' "$out" | sed 's/^/  wrk: /' >&2
  summary="$(printf '%s\n' "$out" | sed -n 's/^WRK_SUMMARY //p')"
  [[ -n "$summary" ]] || die "no summary from wrk -c $c"
  read -r RPS[$c] CPU[$c] < <("$VENV/bin/python" -c '
import json, sys
s = json.loads(sys.argv[1]); ticks, hz = int(sys.argv[2]), int(sys.argv[3])
errs = s["connect"] + s["read"] + s["write"] + s["status"] + s["timeout"]
if errs:
    print(f"wrk reported {errs} errors: {s}", file=sys.stderr)
n = s["requests"]
rps = n / (s["duration_us"] / 1e6)
cpu = ticks / hz * 1000 / n if n else float("nan")
print(f"{rps:.1f} {cpu:.3f}")' "$summary" "$((t1 - t0))" "$TICKS")
  log "c=$c: ${RPS[$c]} req/s, ${CPU[$c]} cpu ms/call ($((t1 - t0)) ticks @ ${TICKS} Hz)"
done

mcpo_hwm="$(hwm_kib "$MCPO_PID")"
node_hwm="$(hwm_kib "$NODE_PID")"

rps_args=(); cpu_args=()
for c in $CONNS; do rps_args+=("$c=${RPS[$c]}"); cpu_args+=("$c=${CPU[$c]}"); done

"$VENV/bin/python" - "$seq_json" "$mcpo_hwm" "$node_hwm" "$SECONDS_PER_RUN" \
  "${rps_args[*]}" "${cpu_args[*]}" "$("$VENV/bin/python" -m pip freeze 2>/dev/null | sed -n 's/^mcpo==//p')" <<'PY'
import json, sys
seq = json.loads(sys.argv[1])
kv = lambda s: {k: float(v) for k, v in (x.split("=") for x in s.split())}
print(json.dumps({
    "path": "mcpo",
    "mcpo_version": sys.argv[7],
    "seq_n": seq["n"],
    "p50_ms": seq["p50_ms"], "p90_ms": seq["p90_ms"], "p99_ms": seq["p99_ms"],
    "wrk_seconds": int(sys.argv[4]),
    "rps": kv(sys.argv[5]),
    "cpu_ms_per_call": kv(sys.argv[6]),
    "peak_rss_mib": {"mcpo": round(int(sys.argv[2]) / 1024, 1),
                     "node": round(int(sys.argv[3]) / 1024, 1)},
}))
PY
