#!/usr/bin/env bash
# Generates the Python stubs for toolgate's proto into ./gen (gitignored):
#   gen/toolgate/v1/toolgate_pb2.py, toolgate_pb2_grpc.py (ToolGateway: the worker)
#   gen/toolgate/v1/call_approvals_pb2.py, call_approvals_pb2_grpc.py
#   (CallApprovalsService: the approver)
# Uses the interpreter in $PYTHON (default: python3), which needs grpcio-tools
# (pip install -r requirements.txt). Rerun whenever proto/ changes.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROTO_ROOT="$HERE/../../proto"
PYTHON="${PYTHON:-python3}"
rm -rf "$HERE/gen"
mkdir -p "$HERE/gen"
"$PYTHON" -m grpc_tools.protoc \
  -I"$PROTO_ROOT" \
  --python_out="$HERE/gen" \
  --pyi_out="$HERE/gen" \
  --grpc_python_out="$HERE/gen" \
  toolgate/v1/toolgate.proto toolgate/v1/call_approvals.proto
echo "generated $HERE/gen/toolgate/v1 from $(cd "$PROTO_ROOT" && pwd)/toolgate/v1/{toolgate,call_approvals}.proto" >&2
