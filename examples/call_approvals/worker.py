#!/usr/bin/env python3
"""An example worker whose tool call a person must approve first.

    pip install -r requirements.txt && ./generate.sh
    export TOOLGATE_TOKEN=...                 # the worker's token
    python worker.py everything__echo '{"message": "hi"}'            # waits on its stream
    python worker.py --unary everything__echo '{"message": "hi"}'    # retries with approval_id

It speaks only toolgate's gRPC API (grpcio and the generated stubs): no MCP
library. The token comes from TOOLGATE_TOKEN, sent as `authorization: Bearer
<token>`.

By default the call goes over InvokeToolInteractive. When the tenant's policy
has a `require_approval` rule for the call, the gateway sends an
`approval_pending` event (the approval's id, its rule, when it expires
undecided), and the call waits on the same stream: it goes on by itself once a
person approves it (`toolgate call-approvals approve ID`, or `approver.py
approve ID`), and ends with PERMISSION_DENIED (APPROVAL_DENIED) when denied,
FAILED_PRECONDITION (APPROVAL_EXPIRED) when nobody decides in time, or at
--timeout. The request stream stays open while it waits: closing it cancels
the call.

With --unary, the call goes over InvokeTool, which cannot wait: a held call is
refused with FAILED_PRECONDITION, reason APPROVAL_PENDING, and the approval's
id in the ErrorInfo metadata (`approval_id`, with `rule`,
`expires_at_unix_ms`, `tool`). The worker then retries the same call with
`approval_id` every --poll seconds (the retry is refused APPROVAL_PENDING
again while nobody has decided, and runs the call, once, when approved) until
--timeout.

Arguments:
    TOOL         the exposed tool name
    ARGS         the arguments as a JSON object (default: {})
    --addr       the gateway, host:port (default $TOOLGATE_ADDR, else
                 127.0.0.1:50051); plaintext
    --timeout    how long to wait in all, seconds (default 900): the stream's
                 deadline, or (--unary) the time to keep retrying
    --unary      InvokeTool and retries with approval_id instead of a stream
    --poll       (--unary) seconds between retries (default 2)

Output: `approval pending: ID (rule RULE, expires 2026-05-01T12:14:00Z, in 14m)`
when the call is held, `waiting for approval ID ...`; then the result
(`is_error: false`, `text: ...`), or the final status
(`status: CODE (REASON) {metadata}: message`) read from the ErrorInfo in
grpc-status-details-bin, with `denied: ...` or `expired: ...` for a decision.

Exit codes: 0 a result (also is_error: true); 2 usage; 3 UNAUTHENTICATED,
4 NOT_FOUND, 5 INVALID_ARGUMENT, 6 FAILED_PRECONDITION (APPROVAL_EXPIRED,
APPROVAL_PENDING still at --timeout with --unary), 7 RESOURCE_EXHAUSTED
(APPROVAL_LIMIT: too many pending), 8 UNAVAILABLE, 9 DEADLINE_EXCEEDED,
11 UNKNOWN, 12 PERMISSION_DENIED (APPROVAL_DENIED), 10 anything else.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import time

import common  # sets up the import path of the generated stubs
from common import EXIT_OTHER, EXIT_USAGE, ToolError, relative, rfc3339

try:
    import grpc
    from toolgate.v1 import toolgate_pb2 as pb
    from toolgate.v1 import toolgate_pb2_grpc as pb_grpc
except ImportError as e:  # pragma: no cover - a setup problem, said plainly
    sys.exit(
        f"worker.py: cannot import {e.name}: run `pip install -r {common.HERE / 'requirements.txt'}` "
        f"and `{common.HERE / 'generate.sh'}` first"
    )


def pending(approval_id: str, rule: str, expires_at_unix_ms: int) -> None:
    """What a held call prints: the approval, and how a person decides it."""
    print(
        f"approval pending: {approval_id} (rule {rule}, expires {rfc3339(expires_at_unix_ms)}, "
        f"{relative(expires_at_unix_ms)})",
        flush=True,
    )
    print(
        f"waiting for approval {approval_id}: `toolgate call-approvals approve {approval_id}` "
        f"or `approver.py approve {approval_id} --reason ...`",
        flush=True,
    )


def print_result(response) -> None:
    print(f"is_error: {'true' if response.is_error else 'false'}")
    print("text: " + response.text.replace("\n", "\n      "))
    if response.structured_content_json:
        structured = json.loads(response.structured_content_json)
        print("structured_content: " + json.dumps(structured, sort_keys=True, separators=(",", ":")))


def report(error: ToolError) -> int:
    """The final status, and what it means for a held call."""
    print(f"status: {error.describe()}", flush=True)
    approval = error.metadata.get("approval_id", "")
    if error.reason == "APPROVAL_DENIED":
        print(f"denied: approval {approval} was denied; the call did not run")
    elif error.reason == "APPROVAL_EXPIRED":
        print(f"expired: nobody decided approval {approval} in time; the call did not run")
    elif error.reason == "APPROVAL_PENDING":
        print(f"still pending: approval {approval}; retry later with approval_id={approval}")
    return error.exit_code()


def interactive(stub, metadata, call, timeout: float) -> int:
    """InvokeToolInteractive: send the call, keep the stream open, print each event."""
    outgoing: queue.Queue = queue.Queue()
    outgoing.put(pb.InteractiveRequest(call=call))

    def requests():
        while True:
            message = outgoing.get()
            if message is None:
                return
            yield message

    events = stub.InvokeToolInteractive(requests(), metadata=metadata, timeout=timeout)
    try:
        for event in events:
            which = event.WhichOneof("event")
            if which == "approval_pending":
                held = event.approval_pending
                pending(held.approval_id, held.rule, held.expires_at_unix_ms)
            elif which == "progress":
                print(f"progress: {event.progress.progress:g} {event.progress.message}".rstrip(), flush=True)
            elif which == "input_required":
                # Not opted in to (no accepts_input), so toolgate does not send it.
                print("worker.py: the tool asks questions; this worker answers none", file=sys.stderr)
                return EXIT_OTHER
            elif which == "result":
                print_result(event.result)
                return 0
    finally:
        outgoing.put(None)  # ends the request stream
    print("worker.py: the stream ended without a result", file=sys.stderr)
    return EXIT_OTHER


def unary(stub, metadata, call, timeout: float, poll: float) -> int:
    """InvokeTool; on APPROVAL_PENDING, the same call again with approval_id until decided."""
    give_up = time.monotonic() + timeout
    announced = ""
    while True:
        left = give_up - time.monotonic()
        try:
            response = stub.InvokeTool(call, metadata=metadata, timeout=max(left, 1.0))
        except grpc.RpcError as err:
            error = ToolError.from_rpc_error(err)
            if error.reason != "APPROVAL_PENDING" or time.monotonic() + poll > give_up:
                return report(error)
            approval = error.metadata.get("approval_id", "")
            if approval != announced:
                expires = int(error.metadata.get("expires_at_unix_ms", "0") or 0)
                pending(approval, error.metadata.get("rule", ""), expires)
                announced = approval
            call.approval_id = approval
            time.sleep(poll)
            continue
        print_result(response)
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="See the module docstring.")
    parser.add_argument("tool")
    parser.add_argument("args", nargs="?", default="{}")
    parser.add_argument("--addr", help="gateway host:port (default: $TOOLGATE_ADDR, else 127.0.0.1:50051)")
    parser.add_argument("--timeout", type=float, default=900.0, help="how long to wait in all, seconds")
    parser.add_argument("--unary", action="store_true", help="InvokeTool, retried with approval_id")
    parser.add_argument("--poll", type=float, default=2.0, help="(--unary) seconds between retries")
    args = parser.parse_args(argv)
    try:
        if not isinstance(json.loads(args.args), dict):
            raise ValueError("not an object")
    except ValueError as e:
        print(f"worker.py: ARGS is not a JSON object: {e}", file=sys.stderr)
        return EXIT_USAGE
    metadata = common.bearer("TOOLGATE_TOKEN")
    call = pb.InvokeToolRequest(name=args.tool, arguments_json=args.args)
    with grpc.insecure_channel(common.address(args.addr)) as channel:
        stub = pb_grpc.ToolGatewayStub(channel)
        try:
            if args.unary:
                return unary(stub, metadata, call, args.timeout, args.poll)
            return interactive(stub, metadata, call, args.timeout)
        except grpc.RpcError as err:
            return report(ToolError.from_rpc_error(err))
        except KeyboardInterrupt:
            return 130


if __name__ == "__main__":
    sys.exit(main())
