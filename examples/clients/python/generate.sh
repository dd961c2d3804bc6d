#!/usr/bin/env bash
# Generates the Python stubs for toolgate's proto into ./gen (gitignored):
#   gen/toolgate/v1/toolgate_pb2.py, toolgate_pb2_grpc.py, toolgate_pb2.pyi
# Uses the interpreter in $PYTHON (default: python3), which needs grpcio-tools
# (pip install -r requirements.txt). Rerun whenever proto/ changes.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROTO_ROOT="$HERE/../../../proto"
PYTHON="${PYTHON:-python3}"
rm -rf "$HERE/gen"
mkdir -p "$HERE/gen"
"$PYTHON" -m grpc_tools.protoc \
  -I"$PROTO_ROOT" \
  --python_out="$HERE/gen" \
  --pyi_out="$HERE/gen" \
  --grpc_python_out="$HERE/gen" \
  toolgate/v1/toolgate.proto
echo "generated $HERE/gen/toolgate/v1 from $(cd "$PROTO_ROOT" && pwd)/toolgate/v1/toolgate.proto" >&2
