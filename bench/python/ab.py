"""Two or more toolgate builds compared on one load, round by round.

    .venv/bin/python bench/python/ab.py --server target/release/toolgate-bench \
        [--rounds 15] [--duration 5] before=/path/to/old/toolgate after=target/release/toolgate

Starts one gateway per build, each with the same configuration on its own
loopback port (one tenant, the bench's fast stdio server `toolgate-bench
mcp-server` as `fast`, no audit, state, guards or policy), and one
grpc_load.py client per gateway (16 calls in flight). Then, for each of
--rounds rounds, it loads each gateway in turn for --duration seconds and
reads the gateway's CPU from /proc: the builds share every round's
conditions on a noisy machine. It prints each round, each build's median CPU
per call (min, max) and RSS after the load, and the per-round ratio of each
build to the first. See docs/performance.md ("The call pipeline").
Exit codes: 0 ok, 2 usage error, 3 a gateway or client failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TICK = os.sysconf("SC_CLK_TCK")
CONFIG = """listen: "127.0.0.1:{port}"
shutdown_delay: "0s"
limits:
  max_message_bytes: 268435456
  max_result_bytes: 268435456
tenants:
  - name: bench
    tokens: [bench-token]
    servers:
      - name: fast
        command: ["{server}", "mcp-server"]
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def status_mib(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True, help="path of toolgate-bench (its mcp-server)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--port", type=int, default=51200, help="the first gateway's port")
    parser.add_argument("builds", nargs="+", help="name=path of a toolgate binary")
    args = parser.parse_args()
    builds = []
    for spec in args.builds:
        name, _, path = spec.partition("=")
        if not name or not path or not Path(path).is_file():
            print(f"ab.py: `{spec}` is not name=path of a file", file=sys.stderr)
            return 2
        builds.append((name, path))
    if len(builds) < 2:
        print("ab.py: name two builds or more", file=sys.stderr)
        return 2
    python = REPO / ".venv" / "bin" / "python"
    work = tempfile.TemporaryDirectory()
    gateways, clients = {}, {}
    try:
        for i, (name, path) in enumerate(builds):
            config = Path(work.name) / f"{name}.yaml"
            config.write_text(CONFIG.format(port=args.port + i, server=args.server))
            gateways[name] = subprocess.Popen(
                [path, "serve", "--config", str(config)],
                env=dict(os.environ, RUST_LOG="error"),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        time.sleep(3)
        for i, (name, _) in enumerate(builds):
            client = subprocess.Popen(
                [str(python), str(REPO / "bench/python/grpc_load.py"),
                 "--addr", f"127.0.0.1:{args.port + i}", "--name", "fast__echo",
                 "--token", "bench-token", "--in-flight", "16",
                 "--duration", str(args.duration)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )
            if client.stdout.readline().strip() != "ready":
                print(f"ab.py: the client of `{name}` did not start", file=sys.stderr)
                return 3
            clients[name] = client
        per_call = {name: [] for name, _ in builds}
        for number in range(1, args.rounds + 1):
            for name, _ in builds:
                pid, client = gateways[name].pid, clients[name]
                before = cpu_seconds(pid)
                client.stdin.write("go\n")
                client.stdin.flush()
                run = json.loads(client.stdout.readline())
                after = cpu_seconds(pid)
                if run["errors"] or not run["calls"]:
                    print(f"ab.py: `{name}` failed calls: {run}", file=sys.stderr)
                    return 3
                per_call[name].append((after - before) * 1000 / run["calls"])
            print(number, " ".join(f"{n}={v[-1]:.4f}" for n, v in per_call.items()), flush=True)
        for name, _ in builds:
            values, pid = per_call[name], gateways[name].pid
            print(f"{name}: gateway CPU per call median {statistics.median(values):.4f} ms "
                  f"(min {min(values):.4f}, max {max(values):.4f}, n={len(values)}); "
                  f"RSS after load {status_mib(pid, 'VmRSS:'):.1f} MiB "
                  f"(anonymous {status_mib(pid, 'RssAnon:'):.1f}, file {status_mib(pid, 'RssFile:'):.1f})")
        first = builds[0][0]
        for name, _ in builds[1:]:
            ratios = [b / a for a, b in zip(per_call[first], per_call[name])]
            print(f"{name}/{first} per round: median {statistics.median(ratios):.3f} "
                  f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
        return 0
    finally:
        for client in clients.values():
            client.stdin.close()
            client.wait()
        for gateway in gateways.values():
            gateway.terminate()
            gateway.wait()
        work.cleanup()


if __name__ == "__main__":
    sys.exit(main())
