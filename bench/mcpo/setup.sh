#!/usr/bin/env bash
# Installs what bench/mcpo/run.sh needs:
#   * <repo>/.venv-bench   Python venv with bench/mcpo/requirements.txt (mcpo + pins)
#   * wrk                  from Debian (apt-get) when not already on PATH
#   * server-everything    via tests/setup.sh when its node_modules are missing
# Idempotent: the venv is reinstalled only when requirements.txt (or the
# interpreter) changes, tracked by a stamp file. Override the interpreter with
# PYTHON=/path/to/python3.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
REQ="$HERE/requirements.txt"
VENV="$ROOT/.venv-bench"
STAMP="$VENV/.toolgate-bench-stamp"
PYTHON="${PYTHON:-python3}"
EVERYTHING="$ROOT/tests/fixtures/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"

log() { printf 'bench/mcpo/setup.sh: %s\n' "$*" >&2; }

command -v "$PYTHON" >/dev/null 2>&1 || { log "missing $PYTHON"; exit 1; }

want="$( { cat "$REQ"; "$PYTHON" --version 2>&1; } | sha256sum | cut -d' ' -f1)"
if [[ -x "$VENV/bin/mcpo" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  log "venv up to date: $VENV"
else
  log "creating venv $VENV"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ"
  "$VENV/bin/mcpo" --help >/dev/null
  printf '%s\n' "$want" >"$STAMP"
  log "installed: $("$VENV/bin/python" -m pip freeze | grep -Ei '^(mcpo|mcp|fastapi)==' | tr '\n' ' ')"
fi

if command -v wrk >/dev/null 2>&1; then
  log "wrk present: $(command -v wrk)"
else
  log "installing wrk via apt-get"
  SUDO=""
  if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq wrk >/dev/null
  command -v wrk >/dev/null 2>&1 || { log "wrk install failed"; exit 1; }
fi

if [[ ! -f "$EVERYTHING" ]]; then
  log "server-everything missing; running tests/setup.sh"
  "$ROOT/tests/setup.sh"
fi
[[ -f "$EVERYTHING" ]] || { log "server-everything still missing: $EVERYTHING"; exit 1; }
command -v node >/dev/null 2>&1 || { log "missing node"; exit 1; }
log "ready"
