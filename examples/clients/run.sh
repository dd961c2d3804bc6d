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
#   * checks that the Python examples compile and import (py_compile, then
#     `import worker, consent` with the generated stubs);
#   * for each worker: py__tiny_image (reads the image), py__add (reads the
#     structured content), py__fail (is_error), an unknown tool (NOT_FOUND handled),
#     arguments that are not an object (INVALID_ARGUMENT), a wrong token
#     (UNAUTHENTICATED), a stale catalog pin (FAILED_PRECONDITION, re-listed and
#     retried) and a call whose server dies under it (UNKNOWN, never retried);
#   * questions and tasks (python/questions.py, typescript/src/questions.ts): the
#     same gateway also serves tests/fixtures/python/input_server.py twice, as
#     a 2025-11-25 server (`ask__`, lifecycle initialize: it sends
#     elicitation/create mid-call) and as a 2026-07-28 one (`modern__`, lifecycle
#     discover: it answers input_required), and tests/fixtures/python/tasks_server.py
#     (`tasks__`, SEP-2663 tasks). Each worker answers the booking form of
#     book_table with fixed values over InvokeToolInteractive in both eras, and
#     follows tasks with accepts_task + GetTask: slow_report to completion,
#     ask_then_finish answered with UpdateTask, slow_report cancelled with
#     CancelTask;
#   * per-user OAuth consent (python/consent.py): a second gateway, with a SQLite
#     state store and a consent listener, in front of an OAuth-protected MCP server
#     (tests/fixtures/python/oauth_mcp_server.py) and its authorization server
#     (oauth_as.py); consent.py lists what a subject must authorize, gets the
#     link on UPSTREAM_AUTHORIZATION_REQUIRED, waits while this script plays the
#     user's browser (the authorization server consents for `&user=<name>`), and
#     retries as that user; another subject gets a link of its own, never the
#     first one's token;
#   * stops the gateways and the fixtures.
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
OAUTH_GATEWAY_PID=""
FIXTURE_PIDS=()
# stop PID: SIGTERM, up to 5 s, then SIGKILL (only processes this script started).
stop() {
  local pid="$1"
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
}
cleanup() {
  stop "$GATEWAY_PID"
  stop "$OAUTH_GATEWAY_PID"
  local pid
  for pid in "${FIXTURE_PIDS[@]}"; do stop "$pid"; done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- what the workers need -------------------------------------------------
if ! { [[ -x "$PY" ]] && "$PY" -c 'import mcp, grpc_tools, fastmcp_tasks' 2>/dev/null; }; then
  log "no usable $ROOT/.venv: running tests/setup.sh"
  timeout 600 "$ROOT/tests/setup.sh"
fi
log "python: installing examples/clients/python/requirements.txt into .venv, generating stubs"
PIP_DISABLE_PIP_VERSION_CHECK=1 timeout 300 "$PY" -m pip install --quiet --no-input \
  -r "$HERE/python/requirements.txt"
PYTHON="$PY" timeout 120 "$HERE/python/generate.sh"
log "python: py_compile and import of worker.py, consent.py, questions.py and offerings.py"
"$PY" -m py_compile "$HERE/python/worker.py" "$HERE/python/consent.py" "$HERE/python/questions.py" \
  "$HERE/python/offerings.py"
(cd "$HERE/python" && "$PY" -c 'import consent, offerings, questions, worker') || die "the Python examples do not import"
# questions.py and offerings.py speak gRPC only: they must not load any MCP library.
for example in questions offerings; do
  (cd "$HERE/python" && "$PY" -c "import sys, $example; bad = sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'fastmcp', 'fastmcp_tasks', 'rmcp')); sys.exit(f'$example.py imports {bad}' if bad else 0)") \
    || die "$example.py imports an MCP library"
done
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
state:
  url: "sqlite://$TMP/examples-state.db"   # the tasks handed to workers; not in the working directory
tenants:
  - name: examples
    tokens: ["$TOKEN"]
    servers:
      - name: py
        command: ["$PY", "$ROOT/tests/fixtures/python/env_server.py"]
      - name: crash
        command: ["$PY", "$ROOT/tests/fixtures/python/hostile_server.py", "crash_mid_call"]
      - name: ask
        command: ["$PY", "$ROOT/tests/fixtures/python/input_server.py"]
        lifecycle: initialize
        input: { declare_on_session: true }   # 2025-11-25 declares elicitation once, at initialize
      - name: modern
        command: ["$PY", "$ROOT/tests/fixtures/python/input_server.py"]
        lifecycle: discover
      - name: tasks
        command: ["$PY", "$ROOT/tests/fixtures/python/tasks_server.py"]
        lifecycle: discover
      - name: everything
        command: ["$(command -v node)", "$ROOT/tests/fixtures/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js", "stdio"]
      - name: notes
        command: ["$PY", "$ROOT/tests/fixtures/python/offerings_server.py"]
        lifecycle: initialize
      - name: notes26
        command: ["$PY", "$ROOT/tests/fixtures/python/offerings_server.py"]
        lifecycle: discover
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

# Questions and tasks: a worker that never speaks MCP answers a form (both
# protocol eras) and follows tasks.
run_question_checks() {
  local lang="$1"
  shift
  export TOOLGATE_TOKEN="$TOKEN"
  local booking='{"party_size": 2, "date": "2026-12-31", "confirm": true}'
  check "$lang: answers a 2025-11-25 form (elicitation) over InvokeToolInteractive" 0 \
    '^question [^ ]+ form: Book a table at Chez Rust\?$' '^answer [^ ]+ accept ' \
    '^text: booked Chez Rust: party_size=2 date=2026-12-31 confirm=true$' \
    -- "$@" ask --addr "$ADDR" --values "$booking" ask__book_table '{"restaurant": "Chez Rust"}'
  check "$lang: answers a 2026-07-28 form (input_required) over InvokeToolInteractive" 0 \
    '^question [^ ]+ form: Book a table at Chez Rust\?$' \
    '^text: booked Chez Rust: party_size=2 date=2026-12-31 confirm=true$' \
    -- "$@" ask --addr "$ADDR" --values "$booking" modern__book_table '{"restaurant": "Chez Rust"}'
  check "$lang: declines a form" 0 \
    '^answer [^ ]+ decline$' '^text: declined$' \
    -- "$@" ask --addr "$ADDR" --decline ask__book_table '{"restaurant": "Chez Rust"}'
  check "$lang: follows a task to completion (accepts_task, GetTask)" 0 \
    '^task [^ ]+: working' '^task [^ ]+: completed$' '^text: report ready after 0.5 s$' \
    -- "$@" task --addr "$ADDR" tasks__slow_report '{"seconds": 0.5}'
  check "$lang: answers a task's question (UpdateTask)" 0 \
    '^task [^ ]+: input_required' '^question [^ ]+ form: Your answer about tea\?$' '^text: tea: green$' \
    -- "$@" task --addr "$ADDR" --values '{"answer": "green"}' tasks__ask_then_finish '{"topic": "tea"}'
  check "$lang: cancels a task (CancelTask)" 14 \
    '^task [^ ]+: working' '^task [^ ]+ cancelled$' \
    -- "$@" task --addr "$ADDR" --cancel-after 0.5 tasks__slow_report '{"seconds": 30}'
}

run_question_checks python "$PY" "$HERE/python/questions.py"
run_question_checks typescript node "$HERE/typescript/dist/questions.js"

# Resources, prompts and completion: a worker that never speaks MCP follows a
# resource_link from a tool result, renders a prompt with completion of its
# argument, and watches a resource, against servers of both revisions.
run_offerings_checks() {
  local lang="$1"
  shift
  export TOOLGATE_TOKEN="$TOKEN"
  check "$lang: follows server-everything's resource links (2025-11-25)" 0 \
    '^link everything demo://resource/dynamic/blob/1$' '^read demo://resource/dynamic/blob/1 text/plain: [1-9][0-9]* bytes$' \
    '^link everything demo://resource/dynamic/text/2$' '^read demo://resource/dynamic/text/2 text/plain: Resource 2: ' \
    -- "$@" follow --addr "$ADDR" everything__get-resource-links '{"count": 2}'
  local era server
  for era in "2025-11-25 notes" "2026-07-28 notes26"; do
    server="${era#* }"; era="${era% *}"
    check "$lang: follows a resource link ($era)" 0 \
      "^link $server notes://today\$" '^read notes://today text/plain: Today: ship the gateway$' \
      -- "$@" follow --addr "$ADDR" "${server}__link"
    check "$lang: renders a prompt, completing its arguments ($era)" 0 \
      '^complete language: rust$' '^\[user\] Review this rust code in a strict tone\.$' \
      -- "$@" prompt --addr "$ADDR" "${server}__review" style=strict --complete language=ru
    check "$lang: watches a resource ($era)" 0 \
      "^watching $server notes://today\$" '^update notes://today$' \
      -- "$@" watch --addr "$ADDR" --updates 1 --trigger "${server}__touch" '{}' "$server" notes://today
  done
  check "$lang: completes server-everything's prompt with context (2025-11-25)" 0 \
    '^complete department: Engineering$' '^\[user\] Please promote Alice to the head of the Engineering team\.$' \
    -- "$@" prompt --addr "$ADDR" everything__completable-prompt name=Alice --complete department=Eng
}

run_offerings_checks python "$PY" "$HERE/python/offerings.py"
run_offerings_checks typescript node "$HERE/typescript/dist/offerings.js"

if ! kill -0 "$GATEWAY_PID" 2>/dev/null; then
  FAILED=$((FAILED + 1)); log "the gateway died during the checks"; cat "$TMP/gateway.log" >&2
fi

# ---- per-user OAuth consent (python/consent.py) ------------------------------
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start_fixture NAME SCRIPT ARGS...: starts a Python fixture and sets FIXTURE_PORT
# from the `LISTENING <port>` line it prints.
start_fixture() {
  local name="$1" script="$2"
  shift 2
  : >"$TMP/$name.out"
  "$PY" "$ROOT/tests/fixtures/python/$script" "$@" >>"$TMP/$name.out" 2>"$TMP/$name.err" &
  FIXTURE_PIDS+=("$!")
  FIXTURE_PORT=""
  for _ in $(seq 150); do
    FIXTURE_PORT="$(awk '/^LISTENING /{print $2; exit}' "$TMP/$name.out" 2>/dev/null || true)"
    [[ -n "$FIXTURE_PORT" ]] && return 0
    sleep 0.1
  done
  cat "$TMP/$name.err" >&2
  die "$script did not print LISTENING within 15s"
}

# consent_as URL USER: plays USER's browser. The test authorization server
# consents at once for `&user=USER` and redirects to the gateway's consent
# listener, which sends the browser on to the tenant's consent_return_url
# with a one-time code; prints `303 <code>` (or the HTTP status of the
# listener's page when it did not send the browser on).
consent_as() {
  "$PY" - "$1" "$2" <<'BROWSER'
import sys
import urllib.error
import urllib.request

url, user = sys.argv[1], sys.argv[2]


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


browser = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect)
try:
    browser.open(f"{url}&user={user}", timeout=10)
    sys.exit("the authorization server did not redirect")
except urllib.error.HTTPError as e:
    if e.code != 302:
        sys.exit(f"authorize: HTTP {e.code}")
    callback = e.headers["Location"]
try:
    with browser.open(callback, timeout=10) as page:
        print(page.status)
except urllib.error.HTTPError as e:
    if e.code == 303:
        from urllib.parse import parse_qs, urlsplit
        print(303, parse_qs(urlsplit(e.headers["Location"]).query)["code"][0])
    else:
        print(e.code)
BROWSER
}

log "oauth: starting the test authorization server and the OAuth-protected MCP server"
start_fixture oauth_as oauth_as.py --port 0
AS_PORT="$FIXTURE_PORT"
start_fixture oauth_mcp oauth_mcp_server.py --port 0 --as-url "http://127.0.0.1:$AS_PORT"
MCP_PORT="$FIXTURE_PORT"
OAUTH_PORT="$(free_port)"
CONSENT_PORT="$(free_port)"
OAUTH_ADDR="127.0.0.1:$OAUTH_PORT"
cat >"$TMP/oauth.yaml" <<CONFIG
listen: "$OAUTH_ADDR"
shutdown_delay: "0s"
shutdown_grace: "2s"
state:
  url: "sqlite://$TMP/state.db"
  keys: [{ env: TOOLGATE_STATE_KEY }]
oauth:
  listen: "127.0.0.1:$CONSENT_PORT"
  public_url: "http://127.0.0.1:$CONSENT_PORT"
  allow_private_addresses: true   # the test authorization server is on 127.0.0.1
tenants:
  - name: examples
    tokens: ["$TOKEN"]
    # The application that confirms consents (consent.py --confirm plays it;
    # nothing listens here, the browser below reads the code instead).
    consent_return_url: "http://127.0.0.1:9/consent"
    servers:
      - name: docs
        url: "http://127.0.0.1:$MCP_PORT/mcp"
        oauth: { grant: authorization_code }
CONFIG
log "oauth: starting $BIN on $OAUTH_ADDR (consent listener on 127.0.0.1:$CONSENT_PORT)"
TOOLGATE_STATE_KEY="$("$PY" -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())')" \
  "$BIN" serve --config "$TMP/oauth.yaml" >"$TMP/gateway-oauth.log" 2>&1 &
OAUTH_GATEWAY_PID=$!
for i in $(seq 150); do
  kill -0 "$OAUTH_GATEWAY_PID" 2>/dev/null || { cat "$TMP/gateway-oauth.log" >&2; die "the OAuth gateway exited"; }
  if (exec 3<>"/dev/tcp/127.0.0.1/$OAUTH_PORT") 2>/dev/null; then break; fi
  [[ $i -lt 150 ]] || { cat "$TMP/gateway-oauth.log" >&2; die "the OAuth gateway did not listen on $OAUTH_ADDR within 15s"; }
  sleep 0.1
done

export TOOLGATE_TOKEN="$TOKEN"
CONSENT=("$PY" "$HERE/python/consent.py" --addr "$OAUTH_ADDR")
check "python consent: lists what alice must authorize, with her link" 0 \
  '^servers for subject .alice.:$' "^  docs  AUTHORIZATION_REQUIRED  authorize at: http://127\.0\.0\.1:$AS_PORT/authorize\?" \
  '^1 server\(s\) need this subject.s consent: docs$' \
  -- "${CONSENT[@]}" --subject alice

# The whole consent: the call is refused with the link, the "user" consents,
# consent.py sees it and calls again, as alice.
flow_out="$TMP/consent-flow.out"
timeout 90 "${CONSENT[@]}" --subject alice --wait 60 --poll 0.5 docs__whoami >"$flow_out" 2>&1 &
flow_pid=$!
link=""
for _ in $(seq 300); do
  link="$(sed -n 's/^    \(http[^ ]*\)$/\1/p' "$flow_out" | head -n 1)"
  [[ -n "$link" ]] && break
  kill -0 "$flow_pid" 2>/dev/null || break
  sleep 0.1
done
page="no link"
confirmed="not confirmed"
if [[ -n "$link" ]]; then page="$(consent_as "$link" alice 2>&1)" || true; fi
if [[ "$page" == "303 "* ]]; then
  confirmed="$("${CONSENT[@]}" --subject alice --confirm "${page#303 }" 2>&1)" || true
fi
flow_rc=0
wait "$flow_pid" || flow_rc=$?
flow_name="python consent: alice consents through the link, her application confirms it, and the call runs as her"
if [[ "$flow_rc" == 0 && "$page" == "303 "* && "$confirmed" == "consent for 'docs' confirmed for subject 'alice'" ]] \
  && grep -q '^text: alice$' "$flow_out" \
  && grep -q 'must authorize server .docs. first' "$flow_out" \
  && grep -q '^consent for .docs. received' "$flow_out"; then
  PASSED=$((PASSED + 1)); printf 'ok    %s\n' "$flow_name"
else
  FAILED=$((FAILED + 1)); printf 'FAIL  %s\n' "$flow_name"
  log "$flow_name: exit $flow_rc, consent page: $page, confirmation: $confirmed"; sed 's/^/      | /' "$flow_out"
fi

check "python consent: alice's next call runs at once" 0 \
  '^is_error: false$' '^text: alice$' \
  -- "${CONSENT[@]}" --subject alice docs__whoami
check "python consent: bob gets a link of his own, never alice's token" 6 \
  'must authorize server .docs. first' 'no consent for server .docs. within 1s; nothing was run' \
  -- "${CONSENT[@]}" --subject bob --wait 1 --poll 0.5 docs__whoami
check "python consent: a malformed subject is INVALID_SUBJECT" 5 \
  'INVALID_ARGUMENT \(INVALID_SUBJECT\)' \
  -- "${CONSENT[@]}" --subject 'not visible ascii' docs__whoami

if ! kill -0 "$OAUTH_GATEWAY_PID" 2>/dev/null; then
  FAILED=$((FAILED + 1)); log "the OAuth gateway died during the checks"; cat "$TMP/gateway-oauth.log" >&2
fi
echo "$PASSED passed, $FAILED failed"
[[ $FAILED == 0 ]]
