"""What approver.py and worker.py share: the gateway's address, the bearer
token, toolgate's error details, exit codes, and how times are shown.

Only grpcio, the generated stubs (./generate.sh) and googleapis-common-protos:
no MCP library.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "gen"))

try:
    import grpc
    from google.rpc import error_details_pb2, status_pb2
except ImportError as e:  # pragma: no cover - a setup problem, said plainly
    sys.exit(
        f"{Path(sys.argv[0]).name}: cannot import {e.name}: run `pip install -r {HERE / 'requirements.txt'}` "
        f"and `{HERE / 'generate.sh'}` first"
    )

DEFAULT_ADDR = "127.0.0.1:50051"

# Exit codes, as examples/clients' workers, plus PERMISSION_DENIED (a denied
# call, or an approver the rule does not admit).
EXIT_CODES = {
    grpc.StatusCode.UNAUTHENTICATED: 3,
    grpc.StatusCode.NOT_FOUND: 4,
    grpc.StatusCode.INVALID_ARGUMENT: 5,
    grpc.StatusCode.FAILED_PRECONDITION: 6,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 7,
    grpc.StatusCode.UNAVAILABLE: 8,
    grpc.StatusCode.DEADLINE_EXCEEDED: 9,
    grpc.StatusCode.UNKNOWN: 11,
    grpc.StatusCode.PERMISSION_DENIED: 12,
}
EXIT_OTHER = 10
EXIT_USAGE = 2


def address(flag: str | None) -> str:
    """host:port from --addr, else $TOOLGATE_ADDR, else 127.0.0.1:50051 (an
    `http://` prefix, as the CLI takes it, is dropped; these examples speak
    plaintext only)."""
    addr = flag or os.environ.get("TOOLGATE_ADDR") or DEFAULT_ADDR
    if addr.startswith("https://"):
        print(f"{Path(sys.argv[0]).name}: {addr}: these examples speak plaintext only", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    return addr.removeprefix("http://").rstrip("/")


def bearer(variable: str) -> tuple[tuple[str, str], ...]:
    """The `authorization: Bearer <token>` metadata from the environment variable."""
    token = os.environ.get(variable, "")
    if not token:
        print(f"{Path(sys.argv[0]).name}: {variable} is not set", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    return (("authorization", f"Bearer {token}"),)


@dataclass
class ToolError:
    """A gRPC error with toolgate's ErrorInfo decoded from grpc-status-details-bin."""

    code: grpc.StatusCode
    message: str
    reason: str | None = None  # ErrorInfo.reason; None when the status has none
    metadata: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_rpc_error(cls, err: grpc.RpcError) -> "ToolError":
        out = cls(code=err.code(), message=err.details() or "")
        for key, value in err.trailing_metadata() or ():
            if key != "grpc-status-details-bin":
                continue
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    out.reason, out.metadata = info.reason, dict(info.metadata)
        return out

    def describe(self) -> str:
        reason = self.reason or "no ErrorInfo"
        extra = f" {dict(sorted(self.metadata.items()))}" if self.metadata else ""
        return f"{self.code.name} ({reason}){extra}: {self.message}"

    def exit_code(self) -> int:
        return EXIT_CODES.get(self.code, EXIT_OTHER)


def rfc3339(unix_ms: int) -> str:
    """2026-05-01T12:00:00Z"""
    return datetime.fromtimestamp(unix_ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def relative(unix_ms: int) -> str:
    """How far a time is from now, coarsely: `in 14m`, `3m ago`, `now`."""
    seconds = int(unix_ms / 1000 - time.time())
    if abs(seconds) < 1:
        return "now"
    left = abs(seconds)
    days, hours, minutes = left // 86400, left // 3600 % 24, left // 60 % 60
    if days:
        span = f"{days}d {hours}h" if hours else f"{days}d"
    elif hours:
        span = f"{hours}h {minutes}m" if minutes else f"{hours}h"
    elif minutes:
        span = f"{minutes}m"
    else:
        span = f"{left}s"
    return f"in {span}" if seconds > 0 else f"{span} ago"
