#!/usr/bin/env python3
"""An example toolgate worker: list the tenant's tools, invoke one, read the result.

    pip install -r requirements.txt && ./generate.sh
    TOOLGATE_TOKEN=secret python worker.py --addr 127.0.0.1:50051 py__add '{"a": 2, "b": 3}'

Arguments:
    TOOL         the exposed tool name to invoke (default: the first listed tool
                 whose input schema requires no argument)
    ARGS         the arguments as a JSON object (default: {})
    --addr       the gateway, host:port (default 127.0.0.1:50051); plaintext
    --timeout    deadline of each RPC in seconds (default 30)
    --retries    retries of a call shed, or refused as UNAVAILABLE (default 3)
    --idempotency-key
                 a key naming this call, made once per operation (a UUID):
                 with it, UNKNOWN, DEADLINE_EXCEEDED, ABORTED
                 (CALL_IN_PROGRESS) and a lost connection are retried too,
                 since the gateway never runs a keyed call twice; a retry
                 gets the first call's outcome (`replayed: true`).
                 CALL_IN_DOUBT (the first call may have acted, nobody
                 knows) is final. See docs/api.md, "Retrying safely".
    --catalog-version, --definition-hash
                 pins of a plan made earlier (default: those of the listing
                 this run just made). A stale pin is answered
                 FAILED_PRECONDITION; the worker then lists again and retries
                 once with the new pins.

The token comes from the TOOLGATE_TOKEN environment variable and is sent as
`authorization: Bearer <token>`.

Errors are decoded from `grpc-status-details-bin` (google.rpc.Status holding
google.rpc.ErrorInfo and RetryInfo, see docs/errors.md) and handled by status:

    UNAUTHENTICATED     no retry: fix the token                              exit 3
    NOT_FOUND           no retry: the tool is not in the catalog             exit 4
    INVALID_ARGUMENT    no retry: fix the arguments (message is for a model)  exit 5
    FAILED_PRECONDITION pins outdated: list again, retry once with new pins;
                        UPSTREAM_AUTH_REJECTED (and other reasons): no
                        retry, alert an operator                             exit 6
    RESOURCE_EXHAUSTED  sheds: retry after RetryInfo (or backoff), bounded;
                        size limits: no retry                                exit 7
    UNAVAILABLE         nothing reached the tool: retry after RetryInfo (or
                        backoff when the gateway cannot be reached), bounded  exit 8
    DEADLINE_EXCEEDED   no retry: the tool may have partly run               exit 9
    UNKNOWN             never retried: the call may have reached the tool
                        and its outcome is unknown (UPSTREAM_CONNECTION_LOST,
                        UPSTREAM_HTTP_ERROR, SHUTTING_DOWN): the tool may
                        have acted                                           exit 11
    anything else       no retry                                             exit 10

Exit 0 when the call returned a result, including a result with is_error =
true (the tool ran and reported failure: a successful RPC whose text is meant
for the model; it is printed as `is_error: true`). Exit 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "gen"))

try:
    import grpc
    from google.rpc import error_details_pb2, status_pb2
    from toolgate.v1 import toolgate_pb2 as pb
    from toolgate.v1 import toolgate_pb2_grpc as pb_grpc
except ImportError as e:  # pragma: no cover - a setup problem, said plainly
    sys.exit(
        f"worker.py: cannot import {e.name}: run `pip install -r {HERE / 'requirements.txt'}` "
        f"and `{HERE / 'generate.sh'}` first"
    )

EXIT_CODES = {
    grpc.StatusCode.UNAUTHENTICATED: 3,
    grpc.StatusCode.NOT_FOUND: 4,
    grpc.StatusCode.INVALID_ARGUMENT: 5,
    grpc.StatusCode.FAILED_PRECONDITION: 6,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 7,
    grpc.StatusCode.UNAVAILABLE: 8,
    grpc.StatusCode.DEADLINE_EXCEEDED: 9,
    grpc.StatusCode.UNKNOWN: 11,
}
EXIT_OTHER = 10

# FAILED_PRECONDITION reasons that mean "the plan's pins are outdated".
PIN_REASONS = {"TOOL_DEFINITION_CHANGED", "TOOL_GONE", "CATALOG_VERSION_UNKNOWN"}
# RESOURCE_EXHAUSTED reasons where nothing was sent upstream (load sheds).
SHED_REASONS = {"RATE_LIMITED", "TENANT_CONCURRENCY_LIMIT", "SERVER_CONCURRENCY_LIMIT"}
MAX_DELAY = 10.0  # never sleep longer than this between two attempts


@dataclass
class ToolError:
    """A gRPC error with toolgate's details decoded."""

    code: grpc.StatusCode
    message: str
    reason: str | None = None  # ErrorInfo.reason; None when the status has no ErrorInfo
    metadata: dict[str, str] = field(default_factory=dict)
    retry_delay: float | None = None  # RetryInfo.retry_delay in seconds

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
                elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                    retry = error_details_pb2.RetryInfo()
                    detail.Unpack(retry)
                    out.retry_delay = retry.retry_delay.ToTimedelta().total_seconds()
        return out

    def describe(self) -> str:
        reason = self.reason or "no ErrorInfo"
        extra = f" {self.metadata}" if self.metadata else ""
        return f"{self.code.name} ({reason}){extra}: {self.message}"


class Failed(Exception):
    """Ends the run: a message for the user and an exit code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class RpcFailed(Exception):
    """An RPC that failed for good (after `attempts` retries)."""

    def __init__(self, error: ToolError, attempts: int):
        super().__init__(error.describe())
        self.error = error
        self.attempts = attempts


def retry_delay(error: ToolError, attempt: int, keyed: bool = False) -> float | None:
    """Seconds to wait before retrying `error`, or None when it must not be retried.

    `keyed`: the call carries an idempotency key, so a retry never runs the
    tool twice (docs/api.md, "Retrying safely"): UNKNOWN, DEADLINE_EXCEEDED,
    ABORTED (CALL_IN_PROGRESS) and a lost connection are retried too; the
    retry gets the first call's outcome. CALL_IN_DOUBT is final.
    """
    backoff = min(MAX_DELAY, 0.2 * 2**attempt)
    if keyed and error.code in (
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
    ):
        return min(MAX_DELAY, error.retry_delay if error.retry_delay is not None else backoff)
    if error.code == grpc.StatusCode.UNAVAILABLE:
        # toolgate's UNAVAILABLE means nothing reached the tool (or the tool is
        # idempotent), and always carries RetryInfo.
        if error.retry_delay is not None:
            return min(MAX_DELAY, error.retry_delay)
        if error.reason is None:  # from the client library: the gateway could not be reached
            return backoff
        return None  # not toolgate's rule: do not guess
    if error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.reason in SHED_REASONS:
        return min(MAX_DELAY, error.retry_delay if error.retry_delay is not None else backoff)
    # Never UNKNOWN: the call may have reached the tool, which may have acted.
    # Never FAILED_PRECONDITION (pins are re-listed by the caller; a rejected
    # upstream credential needs an operator), nor anything else.
    return None


def with_retries(what: str, rpc, retries: int, keyed: bool = False):
    """Runs `rpc()`, retrying retryable errors at most `retries` times; raises RpcFailed."""
    attempt = 0
    while True:
        try:
            return rpc()
        except grpc.RpcError as err:
            error = ToolError.from_rpc_error(err)
        delay = retry_delay(error, attempt, keyed)
        if delay is None or attempt >= retries:
            raise RpcFailed(error, attempt)
        attempt += 1
        source = "RetryInfo" if error.retry_delay is not None else "backoff"
        print(f"{what}: {error.describe()}; retry {attempt}/{retries} in {delay:.2f}s ({source})", file=sys.stderr)
        time.sleep(delay)


def explain(error: ToolError, retried: int, addr: str) -> Failed:
    """The message and exit code for an error that ends the run."""
    code, reason = error.code, error.reason
    hint = {
        grpc.StatusCode.UNAUTHENTICATED: "check TOOLGATE_TOKEN (sent as `authorization: Bearer <token>`)",
        grpc.StatusCode.NOT_FOUND: "the tool is not in this tenant's catalog: list the tools again"
        if reason == "TOOL_NOT_FOUND"
        else "the server reports a missing resource",
        grpc.StatusCode.INVALID_ARGUMENT: "fix the arguments (the message is meant for the model)",
        grpc.StatusCode.FAILED_PRECONDITION: "the plan is still outdated after listing again"
        if reason in PIN_REASONS
        else "the first call with this idempotency key may have acted and nobody knows: check its effect, "
        "then call again with a new key"
        if reason == "CALL_IN_DOUBT"
        else "the server refused the gateway's credentials: alert an operator (retrying cannot help)"
        if reason == "UPSTREAM_AUTH_REJECTED"
        else "the server needs something the gateway cannot relay",
        grpc.StatusCode.RESOURCE_EXHAUSTED: "still shed after retrying; back off"
        if reason in SHED_REASONS
        else "a size limit was hit; send or ask for less",
        grpc.StatusCode.UNAVAILABLE: f"cannot reach the gateway at {addr}"
        if reason is None
        else "the gateway is shutting down; retry on another replica"
        if reason == "DRAINING"
        else "still unavailable after retrying (nothing reached the tool)",
        grpc.StatusCode.UNKNOWN: "the tool may have acted; not retried: check its effect before running it again"
        if reason in ("UPSTREAM_CONNECTION_LOST", "UPSTREAM_HTTP_ERROR", "SHUTTING_DOWN")
        else "not retried",
        grpc.StatusCode.DEADLINE_EXCEEDED: "the tool may have partly run; retry only with a longer --timeout",
    }.get(code, "not retried")
    tries = f" after {retried} retr{'y' if retried == 1 else 'ies'}" if retried else ""
    return Failed(f"error{tries}: {error.describe()}\nhint: {hint}", EXIT_CODES.get(code, EXIT_OTHER))


def hints(tool) -> str:
    a = tool.annotations
    flags = []
    for name, short in (("read_only_hint", "ro"), ("destructive_hint", "destr"), ("idempotent_hint", "idem"), ("open_world_hint", "open")):
        if a.HasField(name):
            flags.append(short if getattr(a, name) else f"!{short}")
    return ",".join(flags) or "-"


def print_listing(listing) -> None:
    rows = [("NAME", "SERVER", "TOKENS", "HINTS", "DESCRIPTION")]
    for t in listing.tools:
        desc = t.title or t.description
        desc = desc if len(desc) <= 60 else desc[:57] + "..."
        rows.append((t.name, t.server, str(t.estimated_tokens), hints(t), desc))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4])
    print(f"{len(listing.tools)} tool(s), ~{listing.total_estimated_tokens} tokens, catalog {listing.catalog_version}")
    for s in listing.servers:
        state = pb.ServerState.Name(s.state).removeprefix("SERVER_STATE_")
        why = f" ({s.error})" if s.error and state != "CONNECTED" else ""
        print(f"server {s.name} [{s.transport}]: {state}, {s.tool_count} tool(s){why}")


def default_tool(listing) -> str:
    """The first listed tool whose input schema requires no argument."""
    for t in listing.tools:
        try:
            schema = json.loads(t.input_schema_json or "{}")
        except json.JSONDecodeError:
            continue
        if not schema.get("required"):
            return t.name
    raise Failed("no tool given and no listed tool can be called without arguments", 2)


def print_result(response) -> None:
    if response.replayed:
        # An earlier attempt with the same idempotency key ran the tool.
        print("replayed: true")
    print(f"is_error: {'true' if response.is_error else 'false'}")
    print("text: " + response.text.replace("\n", "\n      "))
    for i, block in enumerate(response.content):
        kind = block.WhichOneof("kind")
        if kind == "text":
            print(f"content[{i}] text: {block.text.text!r}")
        elif kind in ("image", "audio"):
            media = getattr(block, kind)
            print(f"content[{i}] {kind}: {len(media.data)} bytes, {media.mime_type or 'no mime type'}")
        elif kind == "resource_link":
            link = block.resource_link
            size = f", {link.size} bytes" if link.HasField("size") else ""
            print(f"content[{i}] resource_link: {link.uri} name={link.name!r} {link.mime_type or ''}{size}")
        elif kind == "resource":
            res = block.resource
            which = res.WhichOneof("contents")
            if which == "text":
                body = f"text, {len(res.text)} chars"
            elif which == "blob":
                body = f"blob, {len(res.blob)} bytes"
            else:
                body = "no contents"
            print(f"content[{i}] resource: {res.uri} {res.mime_type or ''} ({body})")
        else:
            print(f"content[{i}] unknown block (a newer proto?)")
    if response.structured_content_json:
        structured = json.loads(response.structured_content_json)
        print("structured_content: " + json.dumps(structured, sort_keys=True, separators=(",", ":")))


def run(args: argparse.Namespace) -> int:
    token = os.environ.get("TOOLGATE_TOKEN")
    if not token:
        print("worker.py: TOOLGATE_TOKEN is not set; calling without credentials", file=sys.stderr)
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    try:
        arguments = json.loads(args.args)
    except json.JSONDecodeError as e:
        raise Failed(f"ARGS is not JSON: {e}", 2)
    if not isinstance(arguments, dict):
        print("worker.py: ARGS is not a JSON object; sending it anyway (the gateway refuses it)", file=sys.stderr)

    with grpc.insecure_channel(args.addr) as channel:
        stub = pb_grpc.ToolGatewayStub(channel)

        def list_tools():
            try:
                return with_retries(
                    "ListTools",
                    lambda: stub.ListTools(pb.ListToolsRequest(), metadata=metadata, timeout=args.timeout),
                    args.retries,
                )
            except RpcFailed as f:
                raise explain(f.error, f.attempts, args.addr)

        listing = list_tools()
        print_listing(listing)
        name = args.tool or default_tool(listing)

        def pins(listing) -> tuple[str, str]:
            tool = next((t for t in listing.tools if t.name == name), None)
            return listing.catalog_version, tool.definition_hash if tool else ""

        catalog_version, definition_hash = pins(listing)
        if args.catalog_version is not None:
            catalog_version = args.catalog_version
        if args.definition_hash is not None:
            definition_hash = args.definition_hash
        relisted = False
        while True:
            request = pb.InvokeToolRequest(
                name=name,
                arguments_json=args.args,
                catalog_version=catalog_version,
                definition_hash=definition_hash,
                idempotency_key=args.idempotency_key or "",
            )
            print(f"\ninvoking {name} {args.args} (catalog {catalog_version or '-'}, definition {definition_hash or '-'})")
            try:
                response = with_retries(
                    "InvokeTool",
                    lambda: stub.InvokeTool(request, metadata=metadata, timeout=args.timeout),
                    args.retries,
                    keyed=bool(args.idempotency_key),
                )
            except RpcFailed as f:
                error = f.error
                if error.code == grpc.StatusCode.FAILED_PRECONDITION and error.reason in PIN_REASONS and not relisted:
                    # The catalog moved on since the plan: look again, re-plan, retry once.
                    print(f"InvokeTool: {error.describe()}; listing again", file=sys.stderr)
                    relisted = True
                    listing = list_tools()
                    catalog_version, definition_hash = pins(listing)
                    if not definition_hash:
                        print(f"InvokeTool: {name} is no longer listed", file=sys.stderr)
                    continue
                raise explain(error, f.attempts, args.addr)
            print_result(response)
            return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="See the module docstring for exit codes.")
    parser.add_argument("tool", nargs="?", help="exposed tool name (default: first tool needing no arguments)")
    parser.add_argument("args", nargs="?", default="{}", help="arguments as a JSON object (default: {})")
    parser.add_argument("--addr", default="127.0.0.1:50051", help="gateway host:port (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=30.0, help="deadline of each RPC, seconds (default: %(default)s)")
    parser.add_argument("--retries", type=int, default=3, help="retries of shed/unavailable calls (default: %(default)s)")
    parser.add_argument("--catalog-version", help="pin: the catalog_version a plan was made against")
    parser.add_argument("--definition-hash", help="pin: the definition_hash a plan was made against")
    parser.add_argument(
        "--idempotency-key",
        help="a key naming this call (e.g. a UUID made once per operation): retries after UNKNOWN, "
        "DEADLINE_EXCEEDED, ABORTED or a lost connection are then safe, and get the first call's outcome",
    )
    args = parser.parse_args(argv)
    try:
        return run(args)
    except Failed as f:
        print(f"worker.py: {f}", file=sys.stderr)
        return f.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
