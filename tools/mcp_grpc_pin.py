#!/usr/bin/env python3
"""Extracts the MCP gRPC transport's descriptors from the published PyPI
package, the only place release 0.2.0's protos are (the GitHub repository's
history holds an earlier mcp_messages.proto: ServerInitiatedRequest and
ServerInitiatedResponse where 0.2.0 has InputRequest, InputResponse, Icon).

    .venv/bin/python tools/mcp_grpc_pin.py WHEEL_DIR OUT.binpb

WHEEL_DIR holds the unpacked `mcp-grpc-transport-proto` wheel (its
`mcp_grpc_transport_proto/` package: `pip download --no-deps
mcp-grpc-transport-proto==0.2.0` and unzip it). Writes a FileDescriptorSet of
`mcp_messages.proto` and `mcp.proto` (package `model_context_protocol`) with
the well-known types they import, which prost/tonic compile
(`compile_fds`) and buf reads as an image. Prints each file's services and
message count.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2, duration_pb2, struct_pb2


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    sys.path.insert(0, sys.argv[1])
    fds = descriptor_pb2.FileDescriptorSet()
    modules = [duration_pb2, struct_pb2] + [
        importlib.import_module(f"mcp_grpc_transport_proto.{name}")
        for name in ("mcp_messages_pb2", "mcp_pb2")
    ]
    for module in modules:
        fd = fds.file.add()
        module.DESCRIPTOR.CopyToProto(fd)
        print(f"{fd.name}: package {fd.package}, {len(fd.message_type)} messages, "
              f"services {[s.name for s in fd.service]}")
    Path(sys.argv[2]).write_bytes(fds.SerializeToString(deterministic=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
