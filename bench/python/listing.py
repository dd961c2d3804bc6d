"""ListTools of a large catalog from a Python grpcio client, for toolgate-bench.

    .venv/bin/python bench/python/listing.py --gateway 127.0.0.1:P --floor 127.0.0.1:Q

Calls ListTools (no filters) on the gateway and on the floor server (which
answers the same bytes, recorded from the gateway), alternating, `--calls`
times each after `--warmup` calls, in two ways:

* undecoded: the response is handed over as raw bytes (no deserializer), so
  both sides measure the server and the transport, not the client's decoder;
* decoded: the response is parsed into toolgate.v1.ListToolsResponse, as a
  worker does (stubs compiled from proto/ at start, like the test fixtures).

Prints one JSON object: p50 milliseconds per side and mode, and the size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "fixtures" / "python"))

import grpc_client  # noqa: E402  (compiles the proto into a directory)

METHOD = "/toolgate.v1.ToolGateway/ListTools"
METADATA = (("authorization", "Bearer bench-token"),)
OPTIONS = [("grpc.max_receive_message_length", -1)]


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--floor", required=True)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as out:
        pb2, _, _ = grpc_client.generate_stubs(Path(out))
        decode = pb2.ListToolsResponse.FromString
        channels = {
            side: grpc.insecure_channel(addr, options=OPTIONS)
            for side, addr in (("gateway", args.gateway), ("floor", args.floor))
        }
        calls = {}
        for side, channel in channels.items():
            calls[(side, "undecoded")] = channel.unary_unary(METHOD)
            calls[(side, "decoded")] = channel.unary_unary(METHOD, response_deserializer=decode)
        samples: dict[tuple[str, str], list[float]] = {key: [] for key in calls}
        size = 0
        for i in range(args.warmup + args.calls):
            for key, call in calls.items():
                started = time.perf_counter()
                response = call(b"", metadata=METADATA, timeout=60)
                elapsed = (time.perf_counter() - started) * 1000.0
                if key == ("gateway", "undecoded"):
                    size = len(response)
                elif key[1] == "decoded" and not response.tools:
                    raise SystemExit(f"{key[0]} listed no tools")
                if i >= args.warmup:
                    samples[key].append(elapsed)
        for channel in channels.values():
            channel.close()
    out = {f"{side}_{mode}_p50_ms": p50(s) for (side, mode), s in samples.items()}
    out["bytes"] = size
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
