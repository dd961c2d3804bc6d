#!/usr/bin/env bash
# Checks toolgate's public API with a pinned buf (tools/buf/package.json,
# installed from npm with `npm ci`):
#   1. buf lint: the rules in <repo>/buf.yaml (STANDARD and COMMENTS, with
#      the exceptions listed there);
#   2. buf breaking proto --against proto-baseline: no FILE-level breaking
#      change since the released proto (proto-baseline/README.md). A file
#      the baseline does not hold (an API added since, such as the guard API
#      proto/toolgate/guard/v1/guard.proto) is new: nothing to break yet.
#      The check lists those files, so a run shows what it did not compare.
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
new="$(comm -23 <(cd proto && find . -name '*.proto' | sort) \
                <(cd proto-baseline && find . -name '*.proto' | sort))"
if [[ -n "$new" ]]; then
  echo "   new since the baseline (not compared):"
  sed 's|^\./|     proto/|' <<<"$new"
fi
echo "buf: lint and breaking checks passed"
