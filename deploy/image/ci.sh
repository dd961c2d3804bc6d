#!/usr/bin/env bash
# CI step (.ci/run): the container image, built from deploy/Dockerfile and run
# the way Kubernetes runs it, with real container tools (podman, runc) and no
# image registry.
#
#   1. installs podman, runc and debootstrap when missing (apt-get);
#   2. makes the base images locally (deploy/image/bases.sh: Debian bookworm by
#      debootstrap, plus this machine's Rust toolchain for the builder);
#   3. builds the image; checks its labels, its user, its size and that
#      `toolgate --version` is the crate's version;
#   4. runs it as the Deployment does (user 65532, read-only root filesystem, no
#      capabilities, no privilege escalation, config and token from read-only
#      mounted files) on the host's network, with server-everything on
#      127.0.0.1 over Streamable HTTP, and checks from the host with grpcio:
#      health SERVING, ListTools, InvokeTool; then `podman stop` must end it
#      within the pod's termination grace, with exit 0 and the drain logged;
#   5. builds the derived image of deploy/README.md (its first ```dockerfile
#      block, verbatim: Python added), runs a stdio server in it as the
#      gateway's child, calls it, stops the container and checks that the
#      child saw its stdin close and that no process is left.
#
# Needs root (debootstrap, podman's storage), network access to Debian's
# mirror and crates.io, and what tests/setup.sh installs (.venv with grpcio,
# tests/fixtures/node/node_modules, node). Every wait is bounded; a failure
# says what failed and prints the container's log.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
HERE="$ROOT/deploy/image"
PODMAN="$HERE/podman.sh"
PYTHON="$ROOT/.venv/bin/python"
IMAGE=localhost/toolgate:ci
DERIVED=localhost/toolgate-stdio:ci
NAME="toolgate-ci-$$"
STARTED=$SECONDS

log() { printf 'image [%4ds]: %s\n' "$((SECONDS - STARTED))" "$*" >&2; }
fail() {
  log "FAIL: $*"
  exit 1
}
# podman for the short commands (inspect, exec, logs, top, tag, rm), bounded.
pm() { timeout 120s "$PODMAN" "$@"; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/toolgate-image-ci.XXXXXX")"
FIXTURE_PID=""
cleanup() {
  local status=$?
  pm rm -f -t 0 "$NAME" "$NAME-stdio" >/dev/null 2>&1 || true
  # Untagged layers of earlier builds: without this every run leaves ~100 MB
  # behind. What makes the next build fast stays: the tagged bases and the
  # cache mounts (crate registry, target/).
  pm image prune -f >/dev/null 2>&1 || true
  [[ -n $FIXTURE_PID ]] && kill "$FIXTURE_PID" 2>/dev/null || true
  rm -rf "$WORK"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- 1. tools -----------------------------------------------------------------
missing=()
for tool in podman runc debootstrap; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
  log "installing ${missing[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  timeout 10m apt-get update -qq || fail "apt-get update"
  timeout 10m apt-get install -y -qq --no-install-recommends podman runc debootstrap >/dev/null \
    || fail "apt-get install podman runc debootstrap"
fi
pm --version >&2
[[ -x $PYTHON ]] || fail "$PYTHON is missing: run tests/setup.sh first"
NODE_FIXTURE="$ROOT/tests/fixtures/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
[[ -f $NODE_FIXTURE ]] || fail "server-everything is missing: run tests/setup.sh first"

# ---- 2. base images ---------------------------------------------------------------
log "base images (deploy/image/bases.sh)"
read -r -a base_args < <(timeout 20m "$HERE/bases.sh") || fail "deploy/image/bases.sh"

# ---- 3. the image -------------------------------------------------------------------
crate_version="$(sed -n '/^\[package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)"
revision="$(git rev-parse HEAD)"
source_url="$(git remote get-url origin 2>/dev/null || echo "file://$ROOT")"
log "building $IMAGE from deploy/Dockerfile (a release build: ~20 min cold on 2 cores, ~6 with its cache)"
build_started=$SECONDS
if ! timeout 45m "$PODMAN" build --network host -f deploy/Dockerfile "${base_args[@]}" \
  --build-arg REVISION="$revision" --build-arg SOURCE="$source_url" \
  -t "$IMAGE" . >"$WORK/build.log" 2>&1; then
  tail -40 "$WORK/build.log" >&2
  fail "deploy/Dockerfile does not build (the end of its log above)"
fi
log "built in $((SECONDS - build_started)) s"

label() { pm image inspect --format "{{index .Labels \"org.opencontainers.image.$1\"}}" "$IMAGE"; }
[[ "$(label version)" == "$crate_version" ]] \
  || fail "label org.opencontainers.image.version is '$(label version)', Cargo.toml says $crate_version (deploy/Dockerfile: ARG VERSION)"
[[ "$(label revision)" == "$revision" ]] || fail "label org.opencontainers.image.revision is '$(label revision)', not $revision"
[[ -n "$(label source)" ]] || fail "label org.opencontainers.image.source is empty"
user="$(pm image inspect --format '{{.Config.User}}' "$IMAGE")"
[[ $user == 65532:65532 ]] || fail "the image runs as '$user', not 65532:65532"
printed="$(timeout 60s "$PODMAN" run --rm --network none "$IMAGE" --version)" || fail "toolgate --version does not run in the image"
[[ $printed == "toolgate $crate_version" ]] || fail "toolgate --version prints '$printed', not 'toolgate $crate_version'"
size="$(pm image inspect --format '{{.Size}}' "$IMAGE")"
binary="$(timeout 60s "$PODMAN" run --rm --network none --entrypoint stat "$IMAGE" -c %s /usr/local/bin/toolgate)"
log "image $IMAGE: $((size / 1000000)) MB, binary $((binary / 1000000)) MB; $printed; revision $revision"
((size < 200000000)) || fail "the image is $((size / 1000000)) MB (more than 200 MB: is the binary stripped?)"

# ---- 4. run it as Kubernetes does -------------------------------------------------------
free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# wait_port PORT SECONDS: until something listens on 127.0.0.1:PORT; 1 when
# nothing does in time.
wait_port() {
  "$PYTHON" - "$1" "$2" <<'PY'
import socket, sys, time
port, deadline = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
while True:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(1)
        time.sleep(0.2)
PY
}

# health ADDR: SERVING, NOT_SERVING, ... or UNREACHABLE (grpc.health.v1, 2 s).
health() {
  "$PYTHON" - "$1" <<'PY'
import sys, grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
try:
    with grpc.insecure_channel(sys.argv[1]) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
    print(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
except grpc.RpcError:
    print("UNREACHABLE")
PY
}

# show_log CONTAINER: its log, for a failure.
show_log() {
  log "log of $1:"
  pm logs "$1" 2>&1 | tail -60 >&2 || true
}

# wait_serving CONTAINER ADDR SECONDS
wait_serving() {
  local deadline=$((SECONDS + $3)) status=""
  while ((SECONDS < deadline)); do
    if [[ "$(pm inspect --format '{{.State.Running}}' "$1" 2>/dev/null)" != true ]]; then
      show_log "$1"
      fail "$1 exited before serving (exit $(pm inspect --format '{{.State.ExitCode}}' "$1" 2>/dev/null))"
    fi
    status="$(health "$2")"
    [[ $status == SERVING ]] && return 0
    sleep 0.5
  done
  show_log "$1"
  fail "$1: health is $status, not SERVING, after $3 s"
}

# client CONTAINER ARGS...: tests/fixtures/python/grpc_client.py (grpcio) with
# the tenant's token; its JSON on stdout.
client() {
  local container=$1
  shift
  if ! TOOLGATE_TOKEN="$(cat "$WORK/secrets/ci-token")" timeout 60s "$PYTHON" \
    tests/fixtures/python/grpc_client.py --addr "$GRPC_ADDR" "$@" >"$WORK/out.json" 2>"$WORK/err.txt"; then
    cat "$WORK/err.txt" >&2
    show_log "$container"
    fail "grpc_client.py $* failed"
  fi
  cat "$WORK/out.json"
}

# json EXPR: evaluates EXPR on the JSON object `o` read from stdin.
json() { "$PYTHON" -c "import json, sys; o = json.load(sys.stdin); print($1)"; }

# stop CONTAINER: podman stop within the termination grace; exit 0 and the
# drain in the log.
stop() {
  local started=$SECONDS elapsed code
  timeout $((GRACE + 30))s "$PODMAN" stop -t "$GRACE" "$1" >/dev/null || fail "podman stop $1"
  elapsed=$((SECONDS - started))
  code="$(pm inspect --format '{{.State.ExitCode}}' "$1")"
  pm logs "$1" >"$WORK/$1.log" 2>&1
  if [[ $code != 0 ]]; then
    show_log "$1"
    fail "$1 exited with $code after SIGTERM (137: killed when the ${GRACE} s grace ran out)"
  fi
  for line in 'shutdown: draining' 'shutdown: draining calls in flight' 'closing upstream sessions' 'toolgate stopped'; do
    grep -q "$line" "$WORK/$1.log" || { show_log "$1"; fail "$1: no '$line' in its log"; }
  done
  log "$1 stopped in $elapsed s (grace $GRACE s), exit 0, drain logged"
}

# The pod's termination grace, as the Deployment sets it.
GRACE="$(sed -n 's/^ *terminationGracePeriodSeconds: *\([0-9]*\).*/\1/p' deploy/kubernetes/deployment.yaml)"
[[ -n $GRACE ]] || fail "deploy/kubernetes/deployment.yaml: no terminationGracePeriodSeconds"

# The config and the token as the Deployment mounts them: read-only files, the
# Secret's 0440 readable through the group (fsGroup 65532).
mkdir -p "$WORK/secrets"
head -c 24 /dev/urandom | base64 >"$WORK/secrets/ci-token"
chgrp -R 65532 "$WORK/secrets"
chmod 0750 "$WORK/secrets"
chmod 0440 "$WORK/secrets/ci-token"
MCP_PORT="$(free_port)"
GRPC_PORT="$(free_port)"
GRPC_ADDR="127.0.0.1:$GRPC_PORT"

log "server-everything on 127.0.0.1:$MCP_PORT (Streamable HTTP)"
env -i PATH="$PATH" PORT="$MCP_PORT" node --require "$ROOT/tests/fixtures/node/pin-localhost.cjs" \
  "$NODE_FIXTURE" streamableHttp >"$WORK/everything.log" 2>&1 &
FIXTURE_PID=$!
if ! wait_port "$MCP_PORT" 30; then
  tail -20 "$WORK/everything.log" >&2
  fail "server-everything does not listen on 127.0.0.1:$MCP_PORT after 30 s (its log above)"
fi

# write_config FILE SERVERS_YAML
write_config() {
  cat >"$1" <<YAML
listen: "$GRPC_ADDR"
shutdown_delay: "5s"
shutdown_grace: "20s"
tenants:
  - name: ci
    tokens:
      - file: /etc/toolgate/secrets/ci-token
    servers:
$2
YAML
  chmod 0444 "$1"
}
write_config "$WORK/config.yaml" "      - name: everything
        url: \"http://127.0.0.1:$MCP_PORT/mcp\""

# run_as_pod NAME IMAGE [podman run options...]: the Deployment's securityContext.
run_as_pod() {
  local name=$1 image=$2
  shift 2
  timeout 60s "$PODMAN" run -d --name "$name" --network host \
    --user 65532:65532 --read-only --read-only-tmpfs=false --tmpfs /tmp:rw,size=256m,mode=1777 \
    --cap-drop ALL --security-opt no-new-privileges \
    -v "$WORK/secrets:/etc/toolgate/secrets:ro" "$@" "$image" >/dev/null \
    || fail "podman run $image"
}

log "running $IMAGE as the Deployment does, gRPC on $GRPC_ADDR"
run_as_pod "$NAME" "$IMAGE" -v "$WORK/config.yaml:/etc/toolgate/config.yaml:ro"
wait_serving "$NAME" "$GRPC_ADDR" 60
log "health: SERVING"

# What the pod's securityContext promises, seen from inside.
[[ "$(pm exec "$NAME" id -u)" == 65532 ]] || fail "not running as 65532"
pm exec "$NAME" grep -q '^CapEff:[[:space:]]*0000000000000000$' /proc/1/status || fail "the container has capabilities"
pm exec "$NAME" grep -q '^NoNewPrivs:[[:space:]]*1$' /proc/1/status || fail "privilege escalation is not blocked"
if pm exec "$NAME" touch /etc/toolgate/written 2>/dev/null; then fail "the root filesystem is writable"; fi

tools="$(client "$NAME" list | json '" ".join(t["name"] for t in o["tools"])')"
[[ " $tools " == *" everything__echo "* ]] || fail "ListTools has no everything__echo: $tools"
log "ListTools: $(wc -w <<<"$tools") tools, everything__echo among them"
echoed="$(client "$NAME" invoke everything__echo '{"message": "through the container"}' | json 'o["is_error"], o["text"]')"
[[ $echoed == "False Echo: through the container" ]] || fail "InvokeTool everything__echo answered: $echoed"
log "InvokeTool everything__echo: $echoed"
stop "$NAME"

# ---- 5. the derived image: a stdio server as the gateway's child ------------------------------
# deploy/README.md's first ```dockerfile block, as written there; its FROM is
# the image just built, tagged with that name.
awk '/^```dockerfile[[:space:]]*$/ { open = 1; next } open && /^```/ { exit } open { print }' \
  deploy/README.md >"$WORK/Dockerfile.derived"
from="$(awk '/^FROM / { print $2; exit }' "$WORK/Dockerfile.derived")"
[[ -n $from ]] || fail "deploy/README.md: no \`\`\`dockerfile block with a FROM line"
pm tag "$IMAGE" "$from"
log "building the derived image of deploy/README.md (FROM $from, adds python3)"
if ! timeout 15m "$PODMAN" build --network host -f "$WORK/Dockerfile.derived" -t "$DERIVED" "$WORK" \
  >"$WORK/derived.log" 2>&1; then
  tail -30 "$WORK/derived.log" >&2
  fail "the derived image of deploy/README.md does not build"
fi

write_config "$WORK/config-stdio.yaml" '      - name: stdio
        command: ["/usr/bin/python3", "/opt/ci/stdio_server.py"]
        env: { PATH: "/usr/bin:/bin", HOME: "/tmp" }'
run_as_pod "$NAME-stdio" "$DERIVED" -v "$WORK/config-stdio.yaml:/etc/toolgate/config.yaml:ro" \
  -v "$HERE/stdio_server.py:/opt/ci/stdio_server.py:ro"
wait_serving "$NAME-stdio" "$GRPC_ADDR" 60
echoed="$(client "$NAME-stdio" invoke stdio__echo '{"message": "from a child"}' | json 'o["is_error"], o["text"]')"
[[ $echoed == "False from a child" ]] || fail "InvokeTool stdio__echo answered: $echoed"
log "InvokeTool stdio__echo: $echoed"

# The stdio server's parent is the gateway (pids in the container, and the
# host's pid of the child, to look for it after the stop).
pm top "$NAME-stdio" pid ppid hpid args >"$WORK/top.txt"
gateway_pid="$(awk '$4 == "/usr/local/bin/toolgate" { print $1; exit }' "$WORK/top.txt")"
read -r child_ppid child_hpid < <(awk '/stdio_server.py/ { print $2, $3; exit }' "$WORK/top.txt") || true
if [[ -z $gateway_pid || -z ${child_ppid:-} || $child_ppid != "$gateway_pid" ]]; then
  cat "$WORK/top.txt" >&2
  fail "the stdio server is not the gateway's child"
fi
log "stdio server: child of the gateway (pid $gateway_pid in the container), host pid $child_hpid"
stop "$NAME-stdio"
grep -q 'image-check-stdio: stdin closed, exiting' "$WORK/$NAME-stdio.log" \
  || { show_log "$NAME-stdio"; fail "the stdio server never saw its stdin close"; }
if [[ -e /proc/$child_hpid ]]; then fail "the stdio server (host pid $child_hpid) is still running"; fi
leftover="$(pgrep -f /opt/ci/stdio_server.py || true)"
[[ -z $leftover ]] || fail "processes left behind: $leftover"
log "stdio server: saw its stdin close and exited; nothing left behind"

log "ok: image $((size / 1000000)) MB, all checks passed"
