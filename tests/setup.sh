#!/usr/bin/env bash
# Installs what toolgate's integration tests need, relative to the repo root:
#   * <repo>/.venv                      Python venv with tests/fixtures/python/requirements.txt
#   * <repo>/.venv-sqlite               mcp-server-sqlite (a reference server with resources;
#                                       it needs mcp 1.x) from requirements-sqlite.txt
#   * <repo>/tests/fixtures/node/node_modules   from package.json + package-lock.json (npm ci)
#   * PostgreSQL 15 (Debian's postgresql-15, for the state store tests), when
#     /usr/lib/postgresql/15/bin/initdb is missing; the tests start their own
#     clusters, so the package's default cluster and service are not used
#   * Chromium and its WebDriver (Debian's chromium and chromium-driver), when
#     /usr/bin/chromium or /usr/bin/chromedriver is missing: the consent flow
#     is tested in a real headless browser, driven by Selenium (from PyPI)
#
# Idempotent and fast when nothing changed: each install writes a stamp file
# holding a hash of its inputs (the requirements / lockfile plus the tool
# version), and is skipped while the stamp still matches. Delete .venv or
# node_modules to force a reinstall.
#
# Needs: python3 (with the venv module), node and npm on PATH, and access to the
# PyPI and npm registries the first time. Override the interpreter with
# PYTHON=/path/to/python3.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY_REQ="$ROOT/tests/fixtures/python/requirements.txt"
VENV="$ROOT/.venv"
VENV_STAMP="$VENV/.toolgate-setup-stamp"
SQLITE_REQ="$ROOT/tests/fixtures/python/requirements-sqlite.txt"
SQLITE_VENV="$ROOT/.venv-sqlite"
SQLITE_STAMP="$SQLITE_VENV/.toolgate-setup-stamp"
NODE_DIR="$ROOT/tests/fixtures/node"
NODE_STAMP="$NODE_DIR/node_modules/.toolgate-setup-stamp"
PYTHON="${PYTHON:-python3}"

STARTED=$SECONDS
log() { printf 'setup.sh [%3ds]: %s\n' "$((SECONDS - STARTED))" "$*" >&2; }

need() {
  command -v "$1" >/dev/null 2>&1 || { log "missing required command: $1"; exit 1; }
}

# hash_of TEXT... -> sha256 of the arguments and file contents named by them.
hash_of() {
  local part
  for part in "$@"; do
    if [[ -f "$part" ]]; then cat "$part"; else printf '%s\n' "$part"; fi
  done | sha256sum | cut -d' ' -f1
}

# Serialize concurrent runs (e.g. several test binaries calling this at once).
if command -v flock >/dev/null 2>&1; then
  exec 9>"${TMPDIR:-/tmp}/toolgate-setup-$(printf '%s' "$ROOT" | sha256sum | cut -c1-16).lock"
  flock 9
fi

# ---- PostgreSQL 15 ---------------------------------------------------------
log "1/5 PostgreSQL 15 (apt-get the first time: a minute or two)"
if [[ -x /usr/lib/postgresql/15/bin/initdb ]]; then
  log "postgresql 15 present"
else
  log "installing postgresql-15"
  if [[ "$(id -u)" == 0 ]]; then SUDO=(); else SUDO=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" apt-get install -y -qq --no-install-recommends postgresql-15 >/dev/null
  [[ -x /usr/lib/postgresql/15/bin/initdb ]] || { log "postgresql-15 installed no initdb"; exit 1; }
  log "postgresql 15 ready"
fi

# ---- Chromium ----------------------------------------------------------------
log "2/5 Chromium and chromedriver (apt-get the first time: a few minutes, silent)"
if [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; then
  log "chromium and chromedriver present"
else
  log "installing chromium and chromium-driver"
  if [[ "$(id -u)" == 0 ]]; then SUDO=(); else SUDO=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
  [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]] || { log "chromium-driver installed no /usr/bin/chromedriver"; exit 1; }
  log "chromium ready"
fi

# ---- Python venv -----------------------------------------------------------
log "3/5 Python venv .venv (pip the first time: a few minutes, silent)"
need "$PYTHON"
py_hash="$(hash_of "$PY_REQ" "$("$PYTHON" -c 'import sys; print(sys.version)')")"
if [[ -x "$VENV/bin/python" && -f "$VENV_STAMP" && "$(cat "$VENV_STAMP")" == "$py_hash" ]]; then
  log "python venv up to date ($VENV)"
else
  log "creating python venv at $VENV"
  rm -rf "$VENV"   # start clean so packages dropped from requirements.txt go away
  "$PYTHON" -m venv "$VENV"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/pip" install --quiet --no-input -r "$PY_REQ"
  # Fail here, not in a test, when the SDKs do not import.
  "$VENV/bin/python" -c 'import mcp, grpc, grpc_status, grpc_tools.protoc, google.protobuf, selenium, fastmcp, fastmcp_tasks, docket'
  printf '%s\n' "$py_hash" >"$VENV_STAMP"
  log "python venv ready"
fi

# ---- mcp-server-sqlite (its own venv: it needs mcp 1.x) ----------------------
log "4/5 Python venv .venv-sqlite (pip the first time: a minute)"
sqlite_hash="$(hash_of "$SQLITE_REQ" "$("$PYTHON" -c 'import sys; print(sys.version)')")"
if [[ -x "$SQLITE_VENV/bin/mcp-server-sqlite" && -f "$SQLITE_STAMP" && "$(cat "$SQLITE_STAMP")" == "$sqlite_hash" ]]; then
  log "mcp-server-sqlite venv up to date ($SQLITE_VENV)"
else
  log "creating the mcp-server-sqlite venv at $SQLITE_VENV"
  rm -rf "$SQLITE_VENV"
  "$PYTHON" -m venv "$SQLITE_VENV"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$SQLITE_VENV/bin/pip" install --quiet --no-input -r "$SQLITE_REQ"
  [[ -x "$SQLITE_VENV/bin/mcp-server-sqlite" ]] || { log "mcp-server-sqlite installed no executable"; exit 1; }
  printf '%s\n' "$sqlite_hash" >"$SQLITE_STAMP"
  log "mcp-server-sqlite venv ready"
fi

# ---- Node packages ---------------------------------------------------------
log "5/5 node packages (npm ci the first time: under a minute)"
need node
need npm
node_inputs=("$NODE_DIR/package.json")
[[ -f "$NODE_DIR/package-lock.json" ]] && node_inputs+=("$NODE_DIR/package-lock.json")
node_hash="$(hash_of "${node_inputs[@]}" "$(node --version)")"
if [[ -f "$NODE_STAMP" && "$(cat "$NODE_STAMP")" == "$node_hash" ]]; then
  log "node_modules up to date ($NODE_DIR/node_modules)"
else
  log "installing node packages in $NODE_DIR"
  if [[ -f "$NODE_DIR/package-lock.json" ]]; then
    (cd "$NODE_DIR" && npm ci --no-audit --no-fund --loglevel=error)
  else
    (cd "$NODE_DIR" && npm install --no-audit --no-fund --loglevel=error)
  fi
  printf '%s\n' "$node_hash" >"$NODE_STAMP"
  log "node_modules ready"
fi
log "done"
