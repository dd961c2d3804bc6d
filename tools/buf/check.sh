#!/usr/bin/env bash
# Checks toolgate's public API with a pinned buf (tools/buf/package.json,
# installed from npm with `npm ci`):
#   1. buf lint: the rules in <repo>/buf.yaml (STANDARD and COMMENTS, with
#      the exceptions listed there);
#   2. buf breaking proto --against proto-baseline: no FILE-level breaking
#      change since the released proto (proto-baseline/README.md).
# Exits non-zero when either reports anything.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"

(cd "$HERE" && npm ci --silent --no-audit --no-fund)
BUF="$HERE/node_modules/.bin/buf"

cd "$ROOT"
echo "== buf lint ($("$BUF" --version))"
"$BUF" lint
echo "== buf breaking proto --against proto-baseline"
"$BUF" breaking proto --against proto-baseline
echo "buf: lint and breaking checks passed"
