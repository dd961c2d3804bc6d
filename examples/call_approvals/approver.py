#!/usr/bin/env python3
"""An example approver: list, watch, approve and deny held tool calls.

The tool calls a `require_approval` rule holds for a person's approval, of the
approver's tenant, over toolgate's CallApprovalsService.

    pip install -r requirements.txt && ./generate.sh
    export TOOLGATE_APPROVER_TOKEN=...        # an approver token of the tenant
    python approver.py list                   # pending, newest first
    python approver.py list --state denied --limit 5
    python approver.py show apv_...
    python approver.py approve apv_... --reason "checked with Bob"
    python approver.py deny apv_... --reason "not on a Friday"
    python approver.py watch                  # pending ones, then every change, until Ctrl-C

It speaks only toolgate's gRPC API (grpcio and the generated stubs): no MCP
library. The token comes from TOOLGATE_APPROVER_TOKEN (an approver token,
`tenants[].call_approvals.approver_tokens`, or any token of the tenant whose
caller the rule's `approval.approvers` admits), sent as `authorization: Bearer
<token>`. An approver sees only its own tenant's approvals.

Arguments:
    list|show|approve|deny|watch  what to do
    ID           the approval's id (`apv_...`; show, approve, deny)
    --reason     why (approve, deny; for the audit trail and the worker)
    --state      list: pending (default), approved, denied, expired or spent
    --limit      list: at most this many (default: the gateway's, 100)
    --count      watch: stop after this many messages (default: until Ctrl-C)
    --addr       the gateway, host:port (default $TOOLGATE_ADDR, else
                 127.0.0.1:50051); plaintext
    --timeout    deadline of each unary RPC in seconds (default 30)

Output: for each approval, a line
`APPROVAL_ID STATE TOOL subject SUBJECT rule RULE expires in 14m [may decide]`
(and `decided by WHO: REASON` once decided), then its arguments indented:
`    arguments: {"message": "hi"}`. `list` ends with `N STATE call approval(s)`;
approve and deny print the approval as decided.

Exit codes: 0 done (watch: Ctrl-C or --count reached); 2 usage; a refusal by
its status, read from the ErrorInfo in grpc-status-details-bin and printed as
`CODE (REASON) {metadata}: message`: 3 UNAUTHENTICATED, 4 NOT_FOUND
(CALL_APPROVAL_NOT_FOUND), 5 INVALID_ARGUMENT, 6 FAILED_PRECONDITION
(CALL_APPROVAL_DECIDED), 8 UNAVAILABLE (also: the watch
ended; watch again), 9 DEADLINE_EXCEEDED, 12 PERMISSION_DENIED
(CALL_APPROVAL_NOT_APPROVER: the rule's approvers do not admit this caller), 10
anything else.
"""

from __future__ import annotations

import argparse
import json
import sys

import common  # sets up the import path of the generated stubs
from common import EXIT_CODES, ToolError, relative

try:
    import grpc
    from toolgate.v1 import call_approvals_pb2 as pb
    from toolgate.v1 import call_approvals_pb2_grpc as pb_grpc
except ImportError as e:  # pragma: no cover - a setup problem, said plainly
    sys.exit(
        f"approver.py: cannot import {e.name}: run `pip install -r {common.HERE / 'requirements.txt'}` "
        f"and `{common.HERE / 'generate.sh'}` first"
    )

TOKEN_VARIABLE = "TOOLGATE_APPROVER_TOKEN"
STATES = {
    "pending": pb.CALL_APPROVAL_STATE_PENDING,
    "approved": pb.CALL_APPROVAL_STATE_APPROVED,
    "denied": pb.CALL_APPROVAL_STATE_DENIED,
    "expired": pb.CALL_APPROVAL_STATE_EXPIRED,
    "spent": pb.CALL_APPROVAL_STATE_SPENT,
}
STATE_NAMES = {number: name for name, number in STATES.items()}


def describe(approval) -> str:
    """The approval in two lines: what, who, which rule, until when; the arguments."""
    state = STATE_NAMES.get(approval.state, "unknown")
    line = (
        f"{approval.approval_id} {state} {approval.tool} subject {approval.subject or '(tenant)'} "
        f"rule {approval.rule} expires {relative(approval.expires_at_unix_ms)}"
    )
    if approval.decided_by:
        line += f" decided by {approval.decided_by}"
        if approval.reason:
            line += f": {approval.reason}"
    if approval.may_decide:
        line += " [may decide]"
    try:
        arguments = json.dumps(json.loads(approval.arguments_json or "{}"), sort_keys=True)
    except json.JSONDecodeError:
        arguments = approval.arguments_json
    return f"{line}\n    arguments: {arguments}"


def details(approval) -> str:
    """Every field, as `show` prints it."""
    lines = [describe(approval).splitlines()[0]]
    for name in ("server", "definition_hash", "arguments_sha256", "uses_left"):
        lines.append(f"    {name}: {getattr(approval, name)}")
    lines.append(f"    created_at: {common.rfc3339(approval.created_at_unix_ms)}")
    lines.append(f"    expires_at: {common.rfc3339(approval.expires_at_unix_ms)}")
    if approval.decided_at_unix_ms:
        lines.append(f"    decided_at: {common.rfc3339(approval.decided_at_unix_ms)}")
    try:
        pretty = json.dumps(json.loads(approval.arguments_json or "{}"), indent=2, sort_keys=True)
    except json.JSONDecodeError:
        pretty = approval.arguments_json
    lines.append("    arguments: " + pretty.replace("\n", "\n    "))
    return "\n".join(lines)


def run(args: argparse.Namespace, stub, metadata) -> int:
    if args.command == "list":
        state = STATES[args.state]
        response = stub.ListCallApprovals(
            pb.ListCallApprovalsRequest(state=state, limit=args.limit or 0),
            metadata=metadata,
            timeout=args.timeout,
        )
        for approval in response.approvals:
            print(describe(approval))
        print(f"{len(response.approvals)} {args.state} call approval(s)")
        return 0
    if args.command == "show":
        response = stub.GetCallApproval(
            pb.GetCallApprovalRequest(approval_id=args.id), metadata=metadata, timeout=args.timeout
        )
        print(details(response.approval))
        return 0
    if args.command in ("approve", "deny"):
        if args.command == "approve":
            response = stub.ApproveCall(
                pb.ApproveCallRequest(approval_id=args.id, reason=args.reason),
                metadata=metadata,
                timeout=args.timeout,
            )
        else:
            response = stub.DenyCall(
                pb.DenyCallRequest(approval_id=args.id, reason=args.reason),
                metadata=metadata,
                timeout=args.timeout,
            )
        print(f"{'approved' if args.command == 'approve' else 'denied'} {args.id}")
        print(describe(response.approval))
        return 0
    # watch: no deadline; it runs until Ctrl-C (or --count messages).
    seen = 0
    stream = stub.WatchCallApprovals(pb.WatchCallApprovalsRequest(), metadata=metadata)
    try:
        for message in stream:
            print(describe(message.approval), flush=True)
            seen += 1
            if args.count is not None and seen >= args.count:
                return 0
    finally:
        stream.cancel()
    print("approver.py: the gateway ended the watch; watch again", file=sys.stderr)
    return EXIT_CODES[grpc.StatusCode.UNAVAILABLE]


def main(argv: list[str] | None = None) -> int:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--addr", help="gateway host:port (default: $TOOLGATE_ADDR, else 127.0.0.1:50051)")
    options.add_argument("--timeout", type=float, default=30.0, help="deadline of each unary RPC, seconds")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="See the module docstring.")
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", parents=[options], help="the tenant's call approvals in one state")
    listing.add_argument("--state", choices=sorted(STATES), default="pending")
    listing.add_argument("--limit", type=int, default=None)
    show = commands.add_parser("show", parents=[options], help="every field of one approval")
    show.add_argument("id")
    for verb in ("approve", "deny"):
        decide = commands.add_parser(verb, parents=[options], help=f"{verb} a pending approval")
        decide.add_argument("id")
        decide.add_argument("--reason", default="", help="why (for the audit trail and the worker)")
    watch = commands.add_parser("watch", parents=[options], help="pending approvals, then every change")
    watch.add_argument("--count", type=int, default=None, help="stop after this many messages")
    args = parser.parse_args(argv)
    addr = common.address(args.addr)
    metadata = common.bearer(TOKEN_VARIABLE)
    with grpc.insecure_channel(addr) as channel:
        stub = pb_grpc.CallApprovalsServiceStub(channel)
        try:
            return run(args, stub, metadata)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.CANCELLED and args.command == "watch":
                return 0
            error = ToolError.from_rpc_error(err)
            print(f"approver.py: {error.describe()}", file=sys.stderr)
            return error.exit_code()
        except KeyboardInterrupt:
            return 0 if args.command == "watch" else 130


if __name__ == "__main__":
    sys.exit(main())
