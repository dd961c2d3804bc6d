#!/usr/bin/env bash
# Runs every client scenario of the two pinned @modelcontextprotocol/conformance
# releases (package.json: "conformance-latest" and "conformance-next") against a
# client command, and judges the outcome against expected-failures.txt.
#
#   CONFORMANCE_CLIENT   client command; the runner appends the scenario URL
#                        (default: <repo>/target/debug/toolgate conformance-client)
#   CONFORMANCE_FILTER   optional ERE matched against "<run> <scenario>" to run a subset
#   CONFORMANCE_JOBS     scenarios run in parallel (default 2)
#   CONFORMANCE_TIMEOUT  per-scenario client timeout in ms (default 20000)
#   CONFORMANCE_OUT      where logs and checks.json go (default <repo>/target/conformance)
#
# Runs ("<run>" column, also used in expected-failures.txt):
#   latest           conformance-latest, every client scenario once (0.1.x sets
#                    no MCP_CONFORMANCE_PROTOCOL_VERSION: stateful lifecycle)
#   next@2025-11-25  conformance-next at --spec-version 2025-11-25 (stateful)
#   next@2026-07-28  conformance-next at --spec-version 2026-07-28 (stateless)
#   next@<older>     scenarios that only apply before 2025-11-25, at that version
#   next@extension   extension scenarios (off the spec timeline)
# A scenario that applies to both 2025-11-25 and 2026-07-28 runs under both.
#
# Exit status: 0 only when every run outside the baseline passed and every
# baseline entry still fails (a baseline entry that passes, names a run that does
# not exist, or names a non-auth scenario is an error).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
CLIENT="${CONFORMANCE_CLIENT:-$ROOT/target/debug/toolgate conformance-client}"
FILTER="${CONFORMANCE_FILTER:-}"
JOBS="${CONFORMANCE_JOBS:-2}"
TIMEOUT_MS="${CONFORMANCE_TIMEOUT:-20000}"
OUT="${CONFORMANCE_OUT:-$ROOT/target/conformance}"
BASELINE="$HERE/expected-failures.txt"
NODE="$HERE/node_modules/node/bin/node"
# Hard wall-clock bound per scenario: client timeout + scenario set-up/tear-down.
HARD_TIMEOUT=$(( TIMEOUT_MS / 1000 + 30 ))

die() { echo "conformance: $*" >&2; exit 2; }

# --- install the pinned suites (npm ci is a no-op-ish check when up to date) ---
lock_stamp="$HERE/node_modules/.package-lock.json"
if [[ ! -x "$NODE" || ! -f "$lock_stamp" || "$HERE/package-lock.json" -nt "$lock_stamp" ]]; then
  echo "== conformance: npm ci (pinned suites, node 22)"
  (cd "$HERE" && timeout 600 npm ci --no-audit --no-fund --loglevel=error) || die "npm ci failed"
fi
[[ -x "$NODE" ]] || die "node_modules/node/bin/node missing (did the 'node' package's install script run?)"
node_major="$("$NODE" -p 'process.versions.node.split(".")[0]')"
(( node_major >= 22 )) || die "pinned node is $("$NODE" --version); the suites need >= 22"

# Put the pinned node first on PATH so a client command starting with `node`
# (e.g. the reference client) gets the same runtime.
PATH="$(dirname "$NODE"):$PATH"
export PATH

declare -A PKG_DIR=( [latest]="$HERE/node_modules/conformance-latest" [next]="$HERE/node_modules/conformance-next" )
pkg_version() { "$NODE" -p "require('$1/package.json').version"; }
cli() { local dir="$1"; shift; "$NODE" "$dir/dist/index.js" "$@"; }

# The runner splits the command on single spaces (no quoting): keep paths space-free.
first_word="${CLIENT%% *}"
if [[ "$first_word" == */* && ! -x "$first_word" ]]; then
  die "client command not found or not executable: $first_word (build it first, or set CONFORMANCE_CLIENT)"
fi

# --- enumerate runs: lines "<run> <scenario> <spec-version or ->" ---
runs_file="$(mktemp)"
trap 'rm -f "$runs_file"' EXIT
list_client() { cli "$1" list --client | sed -n 's/^  - \([^ ]*\) \[\(.*\)\]$/\1 \2/p'; }

while read -r scenario tags; do
  echo "latest $scenario -" >>"$runs_file"
done < <(list_client "${PKG_DIR[latest]}")

while read -r scenario tags; do
  IFS=',' read -r -a tag_list <<<"$tags"
  ran=0
  for v in 2025-11-25 2026-07-28; do
    for t in "${tag_list[@]}"; do
      if [[ "$t" == "$v" ]]; then echo "next@$v $scenario $v" >>"$runs_file"; ran=1; fi
    done
  done
  if (( ran == 0 )); then
    last="${tag_list[${#tag_list[@]}-1]}"
    if [[ "$last" == extension ]]; then
      echo "next@extension $scenario -" >>"$runs_file"
    else
      echo "next@$last $scenario $last" >>"$runs_file"
    fi
  fi
done < <(list_client "${PKG_DIR[next]}")

if [[ -n "$FILTER" ]]; then
  grep -E -- "$FILTER" "$runs_file" >"$runs_file.f" || true
  mv "$runs_file.f" "$runs_file"
fi
total=$(wc -l <"$runs_file")
(( total > 0 )) || die "no scenarios selected"

# --- baseline ---
declare -A EXPECTED=()
if [[ -f "$BASELINE" ]]; then
  while IFS= read -r line; do
    line="${line%%#*}"
    read -r run scenario extra <<<"$line" || true
    [[ -z "${run:-}" ]] && continue
    [[ -n "${extra:-}" ]] && die "bad baseline line (want '<run> <scenario>  # reason'): $line"
    [[ "$scenario" == auth/* ]] || die "baseline may list auth scenarios only: $run $scenario"
    EXPECTED["$run $scenario"]=1
  done <"$BASELINE"
fi

echo "== conformance: client: $CLIENT"
echo "== conformance: latest=$(pkg_version "${PKG_DIR[latest]}") next=$(pkg_version "${PKG_DIR[next]}") node=$("$NODE" --version), $total runs, $JOBS at a time"
mkdir -p "$OUT"
rm -rf "$OUT/results" "$OUT"/*.log "$OUT"/*.result

# --- run one scenario; writes "<status> <seconds>" to its .result file ---
run_one() {
  local run="$1" scenario="$2" spec="$3"
  local suite="${run%%@*}" slug="${run}__${scenario//\//_}"
  local log="$OUT/$slug.log" args=()
  [[ "$spec" != - ]] && args+=(--spec-version "$spec")
  local start=$SECONDS rc=0
  # Runs in the caller's directory, so a relative CONFORMANCE_CLIENT works.
  timeout -k 5 "$HARD_TIMEOUT" "$NODE" "${PKG_DIR[$suite]}/dist/index.js" client \
      --command "$CLIENT" --scenario "$scenario" --timeout "$TIMEOUT_MS" \
      -o "$OUT/results/$run" "${args[@]}" >"$log" 2>&1 </dev/null || rc=$?
  local status=PASS
  if (( rc == 124 || rc == 137 )); then status=TIMEOUT
  elif grep -q '^SKIPPED: scenario' "$log"; then status=SKIP
  elif (( rc != 0 )); then status=FAIL
  fi
  echo "$status $(( SECONDS - start ))" >"$OUT/$slug.result"
}

running=0
while read -r run scenario spec; do
  run_one "$run" "$scenario" "$spec" &
  running=$(( running + 1 ))
  if (( running >= JOBS )); then wait -n || true; running=$(( running - 1 )); fi
done <"$runs_file"
wait || true

# --- judge ---
declare -A SEEN=()
passed=0 failed=0 xfail=0
bad_lines=()
printf '\n%-18s %-44s %-8s %s\n' RUN SCENARIO RESULT SECONDS
while read -r run scenario spec; do
  slug="${run}__${scenario//\//_}"
  read -r status secs <"$OUT/$slug.result" 2>/dev/null || { status=MISSING; secs=0; }
  key="$run $scenario"
  SEEN["$key"]=1
  if [[ -n "${EXPECTED[$key]:-}" ]]; then
    if [[ "$status" == PASS ]]; then
      verdict="XPASS"; failed=$((failed + 1)); bad_lines+=("$key: in the baseline but passes now; remove it from expected-failures.txt")
    else
      verdict="xfail"; xfail=$((xfail + 1))
    fi
  elif [[ "$status" == PASS || "$status" == SKIP ]]; then
    verdict="$status"; passed=$((passed + 1))
  else
    verdict="$status"; failed=$((failed + 1)); bad_lines+=("$key: $status (log: $OUT/$slug.log)")
  fi
  printf '%-18s %-44s %-8s %s\n' "$run" "$scenario" "$verdict" "$secs"
done <"$runs_file"

for key in "${!EXPECTED[@]}"; do
  if [[ -z "${SEEN[$key]:-}" && ( -z "$FILTER" || "$key" =~ $FILTER ) ]]; then
    failed=$((failed + 1)); bad_lines+=("$key: in the baseline but no such run exists; remove it")
  fi
done

echo
if (( ${#bad_lines[@]} > 0 )); then
  echo "Problems:"
  printf '  %s\n' "${bad_lines[@]}"
  echo
fi
echo "expected failures (baseline): $xfail"
echo "conformance: $passed passed, $failed failed, $xfail skipped"
(( failed == 0 ))
