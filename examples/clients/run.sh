#!/usr/bin/env bash
# Runs both example workers (python/worker.py, typescript/src/worker.ts) against
# a real gateway and checks what they read:
#
#   * starts `toolgate serve` ($TOOLGATE_BIN, default <repo>/target/debug/toolgate)
#     on a free 127.0.0.1 port, with a temporary config whose one tenant has one
#     stdio server, tests/fixtures/python/env_server.py (tools: get_env, echo,
#     fail, tiny_image, add; exposed as py__<tool>), and one that exits in the
#     middle of every call (tests/fixtures/python/hostile_server.py
#     crash_mid_call; crash__echo);
#   * installs what the workers need: the example's requirements into <repo>/.venv
#     (tests/setup.sh creates it when missing) and the Python stubs (generate.sh);
#     `npm ci` and `npm run build` in typescript/;
#   * for each worker: py__tiny_image (reads the image), py__add (reads the
#     structured content), py__fail (is_error), an unknown tool (NOT_FOUND handled),
#     arguments that are not an object (INVALID_ARGUMENT), a wrong token
#     (UNAUTHENTICATED), a stale catalog pin (FAILED_PRECONDITION, re-listed and
#     retried) and a call whose server dies under it (UNKNOWN, never retried);
#   * stops the gateway.
#
# Exit 0 when every check passed, 1 otherwise. Every step is bounded in time.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${TOOLGATE_BIN:-$ROOT/target/debug/toolgate}"
PY="$ROOT/.venv/bin/python"

log() { printf 'run.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

[[ -x "$BIN" ]] || die "no gateway binary at $BIN (cargo build, or set TOOLGATE_BIN)"
command -v node >/dev/null && command -v npm >/dev/null || die "node and npm are needed"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/toolgate-clients.XXXXXX")"
GATEWAY_PID=""
cleanup() {
  if [[ -n "$GATEWAY_PID" ]] && kill -0 "$GATEWAY_PID" 2>/dev/null; then
    kill -TERM "$GATEWAY_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$GATEWAY_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$GATEWAY_PID" 2>/dev/null || true
    wait "$GATEWAY_PID" 2>/dev/null || true
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- what the workers need -------------------------------------------------
if ! { [[ -x "$PY" ]] && "$PY" -c 'import mcp, grpc_tools' 2>/dev/null; }; then
  log "no usable $ROOT/.venv: running tests/setup.sh"
  timeout 600 "$ROOT/tests/setup.sh"
fi
log "python: installing examples/clients/python/requirements.txt into .venv, generating stubs"
PIP_DISABLE_PIP_VERSION_CHECK=1 timeout 300 "$PY" -m pip install --quiet --no-input \
  -r "$HERE/python/requirements.txt"
PYTHON="$PY" timeout 120 "$HERE/python/generate.sh"
log "typescript: npm ci, npm run build"
(cd "$HERE/typescript" && timeout 300 npm ci --silent --no-audit --no-fund && timeout 120 npm run --silent build)

# ---- the gateway -----------------------------------------------------------
PORT="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
ADDR="127.0.0.1:$PORT"
TOKEN="run-sh-$RANDOM$RANDOM"
cat >"$TMP/config.yaml" <<EOF
listen: "$ADDR"
shutdown_delay: "0s"
shutdown_grace: "2s"
tenants:
  - name: examples
    tokens: ["$TOKEN"]
    servers:
      - name: py
        command: ["$PY", "$ROOT/tests/fixtures/python/env_server.py"]
      - name: crash
        command: ["$PY", "$ROOT/tests/fixtures/python/hostile_server.py", "crash_mid_call"]
EOF
log "starting $BIN on $ADDR"
"$BIN" serve --config "$TMP/config.yaml" >"$TMP/gateway.log" 2>&1 &
GATEWAY_PID=$!
for i in $(seq 150); do
  kill -0 "$GATEWAY_PID" 2>/dev/null || { cat "$TMP/gateway.log" >&2; die "the gateway exited"; }
  if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then break; fi
  [[ $i -lt 150 ]] || { cat "$TMP/gateway.log" >&2; die "the gateway did not listen on $ADDR within 15s"; }
  sleep 0.1
done

# ---- the checks ------------------------------------------------------------
PASSED=0
FAILED=0
# check NAME EXPECTED_EXIT PATTERN... -- COMMAND...: runs COMMAND (60 s at most)
# and checks its exit code and that its stdout+stderr match every PATTERN (grep -E).
check() {
  local name="$1" want="$2"
  shift 2
  local patterns=()
  while [[ "$1" != "--" ]]; do patterns+=("$1"); shift; done
  shift
  local out="$TMP/out" rc=0 ok=1 p
  timeout 60 "$@" >"$out" 2>&1 || rc=$?
  [[ "$rc" == "$want" ]] || { ok=0; log "$name: exit $rc, expected $want"; }
  for p in "${patterns[@]}"; do
    grep -Eq -- "$p" "$out" || { ok=0; log "$name: output lacks /$p/"; }
  done
  if [[ $ok == 1 ]]; then
    PASSED=$((PASSED + 1)); printf 'ok    %s\n' "$name"
  else
    FAILED=$((FAILED + 1)); printf 'FAIL  %s\n' "$name"; sed 's/^/      | /' "$out"
  fi
}

run_worker_checks() {
  local lang="$1"
  shift
  export TOOLGATE_TOKEN="$TOKEN"
  check "$lang: tiny_image reads the image" 0 \
    '^content\[1\] image: [1-9][0-9]* bytes, image/png$' '^is_error: false$' \
    -- "$@" --addr "$ADDR" py__tiny_image
  check "$lang: add reads structured content" 0 \
    '^structured_content: \{"result":42\}$' '^is_error: false$' \
    -- "$@" --addr "$ADDR" py__add '{"a": 40, "b": 2}'
  check "$lang: fail is a result with is_error" 0 \
    '^is_error: true$' '^text: expected failure$' \
    -- "$@" --addr "$ADDR" py__fail '{"message": "expected failure"}'
  check "$lang: an unknown tool is NOT_FOUND" 4 \
    'NOT_FOUND \(TOOL_NOT_FOUND\)' \
    -- "$@" --addr "$ADDR" py__no_such_tool
  check "$lang: arguments that are not an object are INVALID_ARGUMENT" 5 \
    'INVALID_ARGUMENT \(INVALID_ARGUMENTS\)' \
    -- "$@" --addr "$ADDR" py__add '[1, 2]'
  check "$lang: a stale pin is re-listed and retried" 0 \
    'FAILED_PRECONDITION \(TOOL_DEFINITION_CHANGED\)' '^structured_content: \{"result":3\}$' \
    -- "$@" --addr "$ADDR" --definition-hash stale py__add '{"a": 1, "b": 2}'
  # The server exits during the call: the outcome is unknown, so the worker
  # must not retry it (a previous crash may leave the server reconnecting:
  # that UNAVAILABLE is retried, as nothing reached the tool).
  check "$lang: a call lost mid-way is UNKNOWN and not retried" 11 \
    'UNKNOWN \(UPSTREAM_CONNECTION_LOST\)' 'the tool may have acted' \
    -- "$@" --addr "$ADDR" --retries 8 crash__echo '{"text": "once"}'
  TOOLGATE_TOKEN="wrong-token" check "$lang: a wrong token is UNAUTHENTICATED" 3 \
    'UNAUTHENTICATED \(UNAUTHENTICATED\)' \
    -- "$@" --addr "$ADDR" py__add '{"a": 1, "b": 2}'
}

run_worker_checks python "$PY" "$HERE/python/worker.py"
run_worker_checks typescript node "$HERE/typescript/dist/worker.js"

if ! kill -0 "$GATEWAY_PID" 2>/dev/null; then
  FAILED=$((FAILED + 1)); log "the gateway died during the checks"; cat "$TMP/gateway.log" >&2
fi
echo "$PASSED passed, $FAILED failed"
[[ $FAILED == 0 ]]
