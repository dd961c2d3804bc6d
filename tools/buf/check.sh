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
#   3. MCP's gRPC transport, vendored as descriptor sets in proto-vendor/mcp_grpc/
#      (docs/mcp-grpc.md): a third-party API, linted with buf's MINIMAL rules
#      only (its names follow its publisher's style, and its files sit where
#      the publisher's package put them, not in package directories), and the
#      newest release vendored checked for FILE-level breaking changes against
#      the release vendored before it (when one is kept beside it).
# Exits non-zero when any reports anything.
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
VENDOR_LINT='{"version":"v2","lint":{"use":["MINIMAL"],"except":["PACKAGE_DIRECTORY_MATCH"]}}'
VENDOR_BREAKING='{"version":"v2","breaking":{"use":["FILE"]}}'
mapfile -t releases < <(ls proto-vendor/mcp_grpc/*.binpb | sort -V)
echo "== buf lint ${releases[-1]} (third-party: MINIMAL)"
"$BUF" lint "${releases[-1]}" --config "$VENDOR_LINT"
if (( ${#releases[@]} > 1 )); then
  echo "== buf breaking ${releases[-1]} --against ${releases[-2]}"
  "$BUF" breaking "${releases[-1]}" --against "${releases[-2]}" --config "$VENDOR_BREAKING"
else
  echo "   one release of MCP's gRPC transport vendored: no earlier one to compare"
fi
echo "buf: lint and breaking checks passed"
