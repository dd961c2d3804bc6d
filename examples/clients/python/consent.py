#!/usr/bin/env python3
"""An example toolgate worker acting for end users: per-user OAuth consent.

    pip install -r requirements.txt && ./generate.sh
    TOOLGATE_TOKEN=secret python consent.py --subject alice
    TOOLGATE_TOKEN=secret python consent.py --subject alice drive__list_files '{"folder": "/"}'
    TOOLGATE_TOKEN=secret python consent.py --subject alice --confirm CODE

Some upstream servers are configured with per-user OAuth (`grant:
authorization_code`): each call runs with the token of the end user it is
made for, named by the `x-toolgate-subject` metadata (docs/oauth.md). A user
who has not authorized such a server yet gets FAILED_PRECONDITION with
ErrorInfo reason UPSTREAM_AUTHORIZATION_REQUIRED and, in the ErrorInfo
metadata, `authorization_url`: the link at which that user consents. Nothing
ran. This worker shows the link, waits until the user has consented, and
retries the call.

After the user consents, the gateway sends the browser to the tenant's
`consent_return_url` with a one-time `code` query parameter. The application
behind that URL, where the user is logged in, confirms the consent for that
user: `--confirm CODE` does what it does (CompleteAuthorization, with the
logged-in user as the subject). Only then does the grant become usable; a
code confirmed for another subject is refused (PERMISSION_DENIED,
CONSENT_SUBJECT_MISMATCH) and the grant dropped, so a link forwarded to
someone else never lends that person's account. (A tenant with
`confirm_consent: false` skips this step.)

Without TOOL it lists, for the subject, every server and whether the subject
must authorize it first (ListTools sends the subject too, so each server's
state and `authorization_url` are that user's).

Arguments:
    TOOL          the exposed tool name to invoke (none: only list)
    ARGS          the arguments as a JSON object (default: {})
    --subject     the end user the calls act for: 1 to 256 visible ASCII
                  characters, a stable id from your own identity provider
                  (default: none, i.e. the tenant itself)
    --addr        the gateway, host:port (default 127.0.0.1:50051); plaintext
    --timeout     deadline of each RPC in seconds (default 30)
    --wait        how long to wait for the user's consent, seconds (default 300)
    --poll        how often to look whether the user has consented (default 2)
    --retries     retries of an UNAVAILABLE answer, after RetryInfo (default 5)

The token comes from TOOLGATE_TOKEN and is sent as `authorization: Bearer`.
A real worker shows the link in its own user interface, to the user the
subject names.

Exit codes: 0 a result (also `is_error: true`, printed) or a listing;
2 usage; 6 the consent did not come within --wait, or FAILED_PRECONDITION
for another reason; 3 UNAUTHENTICATED; 4 NOT_FOUND; 5 INVALID_ARGUMENT (for
instance INVALID_SUBJECT, or CONSENT_CODE_INVALID); 12 PERMISSION_DENIED
(CONSENT_SUBJECT_MISMATCH: a code confirmed for another subject); 7 RESOURCE_EXHAUSTED; 8 UNAVAILABLE after the
retries; 9 DEADLINE_EXCEEDED; 11 UNKNOWN (the tool may have acted: never
retried); 10 anything else.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "gen"))

try:
    import grpc
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status
    from toolgate.v1 import toolgate_pb2 as pb
    from toolgate.v1 import toolgate_pb2_grpc as pb_grpc
except ImportError as e:  # pragma: no cover - a setup problem, said plainly
    sys.exit(
        f"consent.py: cannot import {e.name}: run `pip install -r {HERE / 'requirements.txt'}` "
        f"and `{HERE / 'generate.sh'}` first"
    )

SUBJECT_METADATA = "x-toolgate-subject"
AUTHORIZATION_REQUIRED = "UPSTREAM_AUTHORIZATION_REQUIRED"
# Consent rounds for one call: a first consent, and a step-up when the server
# later asks for more scope.
MAX_CONSENT_ROUNDS = 3
MAX_DELAY = 10.0

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
EXIT_NO_CONSENT = 6
EXIT_OTHER = 10


@dataclass
class ToolError:
    """A gRPC error with toolgate's details (google.rpc.ErrorInfo, RetryInfo) decoded."""

    code: grpc.StatusCode
    message: str
    reason: str | None = None  # ErrorInfo.reason; None when the status has none
    metadata: dict[str, str] = field(default_factory=dict)
    retry_delay: float | None = None  # RetryInfo, seconds

    @classmethod
    def from_rpc_error(cls, err: grpc.RpcError) -> "ToolError":
        out = cls(code=err.code(), message=err.details() or "")
        status = rpc_status.from_call(err)  # google.rpc.Status from grpc-status-details-bin
        for detail in status.details if status else ():
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                out.reason, out.metadata = info.reason, dict(info.metadata)
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                out.retry_delay = retry.retry_delay.ToTimedelta().total_seconds()
        return out

    @property
    def authorization_url(self) -> str | None:
        """The consent link of an UPSTREAM_AUTHORIZATION_REQUIRED error, else None."""
        if self.code == grpc.StatusCode.FAILED_PRECONDITION and self.reason == AUTHORIZATION_REQUIRED:
            return self.metadata.get("authorization_url") or None
        return None

    def describe(self) -> str:
        return f"{self.code.name} ({self.reason or 'no ErrorInfo'}): {self.message}"


class Failed(Exception):
    """Ends the run: a message and an exit code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def failed(error: ToolError) -> Failed:
    return Failed(error.describe(), EXIT_CODES.get(error.code, EXIT_OTHER))


def rpc_metadata(token: str | None, subject: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata of every RPC made for `subject` (None: the tenant itself)."""
    metadata = []
    if token:
        metadata.append(("authorization", f"Bearer {token}"))
    if subject is not None:
        metadata.append((SUBJECT_METADATA, subject))
    return tuple(metadata)


def state_name(value: int) -> str:
    """A ServerState's name; its number when the stubs predate it."""
    try:
        return pb.ServerState.Name(value).removeprefix("SERVER_STATE_")
    except ValueError:
        return str(value)


def servers_needing_consent(stub, metadata, timeout: float, servers=()) -> dict[str, str]:
    """Server name -> authorization URL, for the servers this subject must authorize first.

    ListTools with the subject's metadata sets `authorization_url` on each
    per-user server that the subject has not authorized; it is empty for
    every other server, and once the subject has consented.
    """
    listing = stub.ListTools(pb.ListToolsRequest(servers=list(servers)), metadata=metadata, timeout=timeout)
    return {s.name: s.authorization_url for s in listing.servers if s.authorization_url}


def print_link(subject: str | None, server: str, url: str) -> None:
    """Shows the consent link. A real worker puts it in front of that user only."""
    who = f"subject {subject!r}" if subject is not None else "the tenant itself (no subject)"
    print(f"{who} must authorize server `{server}` first; open this link and consent:", flush=True)
    print(f"    {url}", flush=True)


def wait_for_consent(stub, metadata, server: str, url: str, *, timeout: float, wait: float, poll: float,
                     show_link: Callable[[str | None, str, str], None], subject: str | None) -> bool:
    """Polls ListTools until the subject no longer needs to authorize `server`.

    Returns False when `wait` seconds pass first. A link shown again after
    five minutes may be a new one (each stays valid ten minutes): show it.
    """
    deadline = time.monotonic() + wait
    print(f"waiting up to {wait:g}s for the consent (Ctrl-C to stop)", flush=True)
    while time.monotonic() < deadline:
        time.sleep(poll)
        try:
            needed = servers_needing_consent(stub, metadata, timeout, servers=[server])
        except grpc.RpcError as err:
            error = ToolError.from_rpc_error(err)
            if error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
                continue  # the gateway is busy or restarting: look again
            raise failed(error)
        if server not in needed:
            return True
        if needed[server] != url:
            url = needed[server]
            show_link(subject, server, url)
    return False


def call_as_user(stub, token: str | None, subject: str | None, name: str, arguments_json: str, *,
                 timeout: float = 30.0, wait: float = 300.0, poll: float = 2.0, retries: int = 5,
                 show_link: Callable[[str | None, str, str], None] = print_link):
    """InvokeTool for `subject`, through its consent if needed; returns the InvokeToolResponse.

    - FAILED_PRECONDITION / UPSTREAM_AUTHORIZATION_REQUIRED: nothing ran. Show
      `authorization_url` (ErrorInfo metadata) to the user, wait until they have
      consented, and call again.
    - UNAVAILABLE (STATE_UNAVAILABLE, UPSTREAM_TOKEN_UNAVAILABLE, or
      UPSTREAM_UNAVAILABLE while the server's tools are being listed after a
      first consent): nothing ran; retry after RetryInfo, bounded.
    - Anything else ends the call (UNKNOWN above all: the tool may have acted).
    """
    metadata = rpc_metadata(token, subject)
    request = pb.InvokeToolRequest(name=name, arguments_json=arguments_json)
    consents = unavailable = 0
    while True:
        try:
            return stub.InvokeTool(request, metadata=metadata, timeout=timeout)
        except grpc.RpcError as err:
            error = ToolError.from_rpc_error(err)
        url = error.authorization_url
        if url is not None:
            consents += 1
            if consents > MAX_CONSENT_ROUNDS:
                raise Failed(f"still asked to authorize after {MAX_CONSENT_ROUNDS} consents: {error.describe()}",
                             EXIT_NO_CONSENT)
            server = error.metadata.get("server", name.split("__", 1)[0])
            show_link(subject, server, url)
            if not wait_for_consent(stub, metadata, server, url, timeout=timeout, wait=wait, poll=poll,
                                    show_link=show_link, subject=subject):
                raise Failed(f"no consent for server `{server}` within {wait:g}s; nothing was run", EXIT_NO_CONSENT)
            print(f"consent for `{server}` received; calling {name} again", flush=True)
            continue
        if error.code == grpc.StatusCode.UNAVAILABLE and error.retry_delay is not None and unavailable < retries:
            unavailable += 1
            delay = min(MAX_DELAY, error.retry_delay * 2 ** (unavailable - 1))
            print(f"{error.describe()}; retry {unavailable}/{retries} in {delay:g}s", file=sys.stderr, flush=True)
            time.sleep(delay)
            continue
        raise failed(error)


def list_servers(stub, token: str | None, subject: str | None, timeout: float) -> None:
    """Prints each server's state for `subject`, with its consent link where needed."""
    listing = stub.ListTools(pb.ListToolsRequest(), metadata=rpc_metadata(token, subject), timeout=timeout)
    who = f"subject {subject!r}" if subject is not None else "the tenant itself (no subject)"
    print(f"servers for {who}:")
    width = max((len(s.name) for s in listing.servers), default=0)
    for s in listing.servers:
        line = f"  {s.name:<{width}}  {state_name(s.state)}"
        if s.authorization_url:
            line += f"  authorize at: {s.authorization_url}"
        elif s.error:
            line += f"  ({s.error})"
        print(line)
    needed = [s.name for s in listing.servers if s.authorization_url]
    print(f"{len(needed)} server(s) need this subject's consent" + (f": {', '.join(needed)}" if needed else ""))


def print_result(response) -> None:
    print(f"is_error: {str(response.is_error).lower()}")
    print(f"text: {response.text}")


def run(args: argparse.Namespace) -> int:
    token = os.environ.get("TOOLGATE_TOKEN")
    if not token:
        print("consent.py: TOOLGATE_TOKEN is not set; calling without credentials", file=sys.stderr)
    try:
        arguments = json.loads(args.args)
    except json.JSONDecodeError as e:
        raise Failed(f"ARGS is not JSON: {e}", 2)
    if not isinstance(arguments, dict):
        raise Failed("ARGS must be a JSON object", 2)
    with grpc.insecure_channel(args.addr) as channel:
        stub = pb_grpc.ToolGatewayStub(channel)
        try:
            if args.confirm is not None:
                confirmed = stub.CompleteAuthorization(
                    pb.CompleteAuthorizationRequest(code=args.confirm),
                    metadata=rpc_metadata(token, args.subject),
                    timeout=args.timeout,
                )
                print(f"consent for {confirmed.server!r} confirmed for subject {args.subject!r}")
                return 0
            if args.tool is None:
                list_servers(stub, token, args.subject, args.timeout)
                return 0
            response = call_as_user(stub, token, args.subject, args.tool, args.args, timeout=args.timeout,
                                    wait=args.wait, poll=args.poll, retries=args.retries)
        except grpc.RpcError as err:
            raise failed(ToolError.from_rpc_error(err))
        print_result(response)
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="See the module docstring for exit codes.")
    parser.add_argument("tool", nargs="?", help="exposed tool name to invoke (none: list the servers)")
    parser.add_argument("args", nargs="?", default="{}", help="arguments as a JSON object (default: {})")
    parser.add_argument("--subject", help="the end user the calls act for (default: the tenant itself)")
    parser.add_argument("--addr", default="127.0.0.1:50051", help="gateway host:port (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=30.0, help="deadline of each RPC, seconds (default: %(default)s)")
    parser.add_argument("--wait", type=float, default=300.0, help="how long to wait for a consent, seconds (default: %(default)s)")
    parser.add_argument("--poll", type=float, default=2.0, help="seconds between two looks for the consent (default: %(default)s)")
    parser.add_argument("--retries", type=int, default=5, help="retries of UNAVAILABLE, after RetryInfo (default: %(default)s)")
    parser.add_argument("--confirm", metavar="CODE",
                        help="confirm the consent the browser brought to consent_return_url (its `code`) for --subject")
    args = parser.parse_args(argv)
    try:
        return run(args)
    except Failed as f:
        print(f"consent.py: {f}", file=sys.stderr)
        return f.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
