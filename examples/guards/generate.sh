#!/usr/bin/env bash
# Generates the Python stubs for toolgate's guard API into ./gen (gitignored),
# or into the directory given as the first argument:
#   <out>/toolgate/guard/v1/guard_pb2.py, guard_pb2_grpc.py, guard_pb2.pyi
# Uses the interpreter in $PYTHON (default: python3), which needs grpcio-tools
# (pip install -r requirements.txt). Rerun whenever proto/ changes.
#
# guard.py finds ./gen by itself; stubs written elsewhere go on PYTHONPATH:
#   ./generate.sh /tmp/stubs && PYTHONPATH=/tmp/stubs python guard.py
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROTO_ROOT="$HERE/../../proto"
PYTHON="${PYTHON:-python3}"
OUT="${1:-$HERE/gen}"
rm -rf "$OUT"
mkdir -p "$OUT"
"$PYTHON" -m grpc_tools.protoc \
  -I"$PROTO_ROOT" \
  --python_out="$OUT" \
  --pyi_out="$OUT" \
  --grpc_python_out="$OUT" \
  toolgate/guard/v1/guard.proto
echo "generated $OUT/toolgate/guard/v1 from $(cd "$PROTO_ROOT" && pwd)/toolgate/guard/v1/guard.proto" >&2
