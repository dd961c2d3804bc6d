"""Load generator for toolgate-bench's Python-client figure (grpcio, grpc.aio).

    .venv/bin/python bench/python/grpc_load.py --addr 127.0.0.1:50051 --name fast__echo \
        [--token bench-token] [--in-flight 16] [--duration 3] [--warmup 200]

Started and driven by `toolgate-bench` (src/bin/toolgate-bench/python.rs); see
docs/performance.md. At start it compiles <repo>/proto/toolgate/v1/toolgate.proto
into a temporary directory with grpc_tools.protoc (as tests/fixtures/python does:
no generated code is committed), opens one channel, makes --warmup sequential
InvokeTool calls and prints `ready` on stdout. Then, for every line read on stdin,
it keeps --in-flight InvokeTool calls in flight on that channel for --duration
seconds and prints one JSON line:

    {"calls": N, "seconds": S, "errors": {"UNAVAILABLE": K, ...}, "first_error": "..."}

(`errors` empty and `first_error` null when every call succeeded). It exits when
stdin ends. Every call sends `{"message":"hello"}` and, with --token,
`authorization: Bearer <token>`. The token is never printed.
Exit codes: 0 ok, 2 usage error, 3 a warm-up call failed (the error on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

import grpc
from grpc_tools import protoc

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
PROTO_FILE = "toolgate/v1/toolgate.proto"


def generate_stubs(out_dir: Path):
    """Compiles the toolgate proto into out_dir and imports the modules."""
    wkt_include = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{wkt_include}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        PROTO_FILE,
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"grpc_tools.protoc failed to compile {PROTO_ROOT / PROTO_FILE}")
    sys.path.insert(0, str(out_dir))
    pb2 = importlib.import_module("toolgate.v1.toolgate_pb2")
    pb2_grpc = importlib.import_module("toolgate.v1.toolgate_pb2_grpc")
    return pb2, pb2_grpc


def describe(error: grpc.aio.AioRpcError) -> str:
    return f"{error.code().name}: {error.details()}"


async def run(stub, request, metadata, in_flight: int, duration: float) -> dict:
    """Keeps in_flight calls running for duration seconds; counts calls and errors."""
    calls = 0
    errors: dict[str, int] = {}
    first_error = None
    deadline = time.monotonic() + duration

    async def worker():
        nonlocal calls, first_error
        while time.monotonic() < deadline:
            try:
                await stub.InvokeTool(request, metadata=metadata, timeout=30)
            except grpc.aio.AioRpcError as error:
                name = error.code().name
                errors[name] = errors.get(name, 0) + 1
                if first_error is None:
                    first_error = describe(error)
            else:
                calls += 1

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    seconds = time.monotonic() - started
    return {"calls": calls, "seconds": seconds, "errors": errors, "first_error": first_error}


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--addr", required=True, help="host:port of the gRPC server")
    parser.add_argument("--name", required=True, help="the tool name sent in InvokeToolRequest")
    parser.add_argument("--token", default=None, help="bearer token (not printed)")
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--warmup", type=int, default=200)
    opts = parser.parse_args()
    if opts.in_flight < 1 or opts.duration <= 0 or opts.warmup < 0:
        parser.error("--in-flight must be >= 1, --duration > 0 and --warmup >= 0")

    with tempfile.TemporaryDirectory(prefix="toolgate-bench-py-") as tmp:
        pb2, pb2_grpc = generate_stubs(Path(tmp))
        metadata = (("authorization", f"Bearer {opts.token}"),) if opts.token else ()
        request = pb2.InvokeToolRequest(name=opts.name, arguments_json='{"message":"hello"}')
        options = [("grpc.max_receive_message_length", -1)]
        async with grpc.aio.insecure_channel(opts.addr, options=options) as channel:
            stub = pb2_grpc.ToolGatewayStub(channel)
            for _ in range(opts.warmup):
                try:
                    await stub.InvokeTool(request, metadata=metadata, timeout=30)
                except grpc.aio.AioRpcError as error:
                    print(f"grpc_load: warm-up call to {opts.addr} ({opts.name}) failed: {describe(error)}",
                          file=sys.stderr)
                    return 3
            print("ready", flush=True)
            loop = asyncio.get_running_loop()
            while True:
                line = await loop.run_in_executor(None, sys.stdin.readline)
                if not line:
                    return 0
                result = await run(stub, request, metadata, opts.in_flight, opts.duration)
                print(json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
