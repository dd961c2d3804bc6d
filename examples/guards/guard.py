#!/usr/bin/env python3
"""An example toolgate guard: redacts e-mail addresses from answers, and keeps
arguments carrying a marker from leaving.

    pip install -r requirements.txt && ./generate.sh
    python guard.py --port 50070

then, in toolgate's configuration (see docs/guards.md):

    guards:
      - name: example
        url: http://127.0.0.1:50070
    tenants:
      - name: acme
        guards: [example]
        ...

toolgate asks a guard about each call twice, through one RPC,
`toolgate.guard.v1.GuardService/Check` (proto/toolgate/guard/v1/guard.proto):

  request phase   before the call goes upstream, with the arguments. This guard
                  DENIES arguments holding the marker (default `DO-NOT-SEND`,
                  `--marker` to change it) anywhere in a string or a key, with a
                  reason naming the marker and where it was; else it ALLOWS.
  response phase  after the server answered, with its MCP result. This guard
                  REPLACES every e-mail address in the result's text with
                  `[email]`: text content blocks, embedded resources' text and
                  every string of `structuredContent` (a tool's result), the
                  text of each resource contents (a resource read), the text of
                  each message (a prompt), the text of each file (a skill).
                  When there was none it ALLOWS, which is cheaper for toolgate
                  than a replacement equal to the original.

Arguments:
    --port       the port on 127.0.0.1 to listen on (default 50070); 0 takes a
                 free one. The guard prints `PORT <n>` on stdout once it serves.
    --marker     the text that must not leave in arguments (default DO-NOT-SEND)
    --token-env  the name of an environment variable holding a token: when set,
                 every Check must carry `authorization: Bearer <token>` (the
                 guard's `token` in toolgate's configuration), else it is
                 refused with UNAUTHENTICATED. The token is never logged.
    --workers    threads answering checks at once (default 8)

A malformed check (a phase or kind it does not know, arguments or a result that
is not a JSON object) is answered with INVALID_ARGUMENT, naming the field: for
toolgate that is a guard failure, handled by the guard's `failure` setting
(`closed` refuses the call, `open` lets it through). The guard logs one line per
check on stderr (call id, phase, target, verdict), never arguments or results.
SIGTERM or Ctrl-C stops it, letting checks in flight finish (5 s at most).
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import re
import signal
import sys
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# The stubs of ./generate.sh; stubs generated elsewhere go on PYTHONPATH,
# which comes first.
sys.path.append(str(HERE / "gen"))

try:
    import grpc
    from toolgate.guard.v1 import guard_pb2 as pb
    from toolgate.guard.v1 import guard_pb2_grpc as pb_grpc
except ImportError as e:  # a setup problem, said plainly
    sys.exit(
        f"guard.py: cannot import {e.name}: run `pip install -r {HERE / 'requirements.txt'}` "
        f"and `{HERE / 'generate.sh'}` first"
    )

# What replaces an address.
EMAIL_REPLACEMENT = "[email]"

# An e-mail address as people write them: a local part, `@`, and a domain with
# at least one dot and a top-level label of letters. Deliberately simpler than
# RFC 5322 (no quoted local parts, no IP literals): a scanner errs on the side
# of what shows up in real text.
EMAIL = re.compile(
    r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+"
    r"@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"\.[A-Za-z]{2,}"
)

# toolgate sends results of up to `limits.max_result_bytes` (16 MiB by
# default) and accepts a replacement of that size: gRPC's default of 4 MiB
# per message would refuse large ones.
MAX_MESSAGE_BYTES = 32 * 1024 * 1024


class BadCheck(Exception):
    """A check this guard cannot judge; answered with INVALID_ARGUMENT."""


# ---------------------------------------------------------------------------
# Response phase: e-mail addresses out of the result's text.
# ---------------------------------------------------------------------------


def redact_text(text: str) -> tuple[str, int]:
    """`text` with each e-mail address replaced, and how many there were."""
    return EMAIL.subn(EMAIL_REPLACEMENT, text)


def redact_strings(value: Any) -> tuple[Any, int]:
    """Every string inside a JSON value redacted (object keys are left alone:
    they are the schema's names, not data)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, list):
        total = 0
        items = []
        for item in value:
            item, n = redact_strings(item)
            items.append(item)
            total += n
        return items, total
    if isinstance(value, dict):
        total = 0
        fields = {}
        for key, item in value.items():
            fields[key], n = redact_strings(item)
            total += n
        return fields, total
    return value, 0


def redact_field(holder: dict, key: str) -> int:
    """Redacts `holder[key]` in place when it is a string."""
    if isinstance(holder.get(key), str):
        holder[key], n = redact_text(holder[key])
        return n
    return 0


def redact_block(block: Any) -> int:
    """One MCP content block, in place: a text block's `text`, an embedded
    resource's `resource.text`. Images, audio, blobs and resource links carry
    no text to scan."""
    if not isinstance(block, dict):
        return 0
    if block.get("type") == "text":
        return redact_field(block, "text")
    if block.get("type") == "resource" and isinstance(block.get("resource"), dict):
        return redact_field(block["resource"], "text")
    return 0


def redact_tool_result(result: dict) -> int:
    """A `CallToolResult`: its content blocks and its structured content."""
    total = sum(redact_block(block) for block in list_of(result, "content"))
    if "structuredContent" in result:
        result["structuredContent"], n = redact_strings(result["structuredContent"])
        total += n
    return total


def redact_resource_result(result: dict) -> int:
    """A `ReadResourceResult`: the text of each of its contents (a blob is
    left alone)."""
    return sum(
        redact_field(contents, "text")
        for contents in list_of(result, "contents")
        if isinstance(contents, dict)
    )


def redact_prompt_result(result: dict) -> int:
    """A `GetPromptResult`: each message's content (one block, or a list of
    blocks)."""
    total = 0
    for message in list_of(result, "messages"):
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        blocks = content if isinstance(content, list) else [content]
        total += sum(redact_block(block) for block in blocks)
    return total


def redact_skill_result(result: dict) -> int:
    """A fetched skill (toolgate's GetSkill): the text of each of its files (a
    blob is left alone)."""
    return sum(
        redact_field(file["content"], "text")
        for file in list_of(result, "files")
        if isinstance(file, dict) and isinstance(file.get("content"), dict)
    )


def list_of(result: dict, key: str) -> list:
    """`result[key]` when it is a list, else nothing to scan."""
    value = result.get(key)
    return value if isinstance(value, list) else []


REDACTORS = {
    pb.TARGET_KIND_TOOL: redact_tool_result,
    pb.TARGET_KIND_RESOURCE: redact_resource_result,
    pb.TARGET_KIND_PROMPT: redact_prompt_result,
    pb.TARGET_KIND_SKILL: redact_skill_result,
}


# ---------------------------------------------------------------------------
# Request phase: the marker stays home.
# ---------------------------------------------------------------------------


def find_marker(value: Any, marker: str, path: str = "$") -> str | None:
    """The JSON path of the first string (value or key) holding `marker`, or
    None. Walking the parsed value, not the JSON text, also catches a marker
    written with escapes (`\\u0044O-NOT-SEND`)."""
    if isinstance(value, str):
        return path if marker in value else None
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = find_marker(item, marker, f"{path}[{index}]")
            if found:
                return found
    if isinstance(value, dict):
        for key, item in value.items():
            if marker in key:
                return f"{path} (a key)"
            found = find_marker(item, marker, f"{path}.{key}")
            if found:
                return found
    return None


def parse_object(text: str, field: str) -> dict:
    """`text` as a JSON object, or BadCheck naming `field`."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadCheck(f"{field} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise BadCheck(f"{field} is not a JSON object")
    return value


# ---------------------------------------------------------------------------
# The service.
# ---------------------------------------------------------------------------


class ExampleGuard(pb_grpc.GuardServiceServicer):
    """Judges one phase of one call per `Check`."""

    def __init__(self, marker: str, token: str | None) -> None:
        self.marker = marker
        self.token = token

    def Check(self, request: pb.CheckRequest, context: grpc.ServicerContext) -> pb.CheckResponse:
        if self.token is not None and not self.authorized(context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        try:
            response, verdict = self.judge(request)
        except BadCheck as e:
            log(request, f"refused the check: {e}")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        log(request, verdict)
        return response

    def authorized(self, context: grpc.ServicerContext) -> bool:
        """Whether the check carries `authorization: Bearer <token>`
        (compared in constant time)."""
        metadata = dict(context.invocation_metadata())
        expected = f"Bearer {self.token}".encode()
        return hmac.compare_digest(metadata.get("authorization", "").encode(), expected)

    def judge(self, request: pb.CheckRequest) -> tuple[pb.CheckResponse, str]:
        """The verdict on one check, and a word for the log."""
        if request.phase == pb.PHASE_REQUEST:
            arguments = parse_object(request.arguments_json, "arguments_json")
            where = find_marker(arguments, self.marker)
            if where is None:
                return pb.CheckResponse(allow=pb.Allow()), "allow"
            reason = f"the arguments contain the marker `{self.marker}` (at {where}): they may not leave"
            # The reason goes back to the worker, who sent the arguments; the
            # log gets the verdict alone.
            return pb.CheckResponse(deny=pb.Deny(reason=reason)), "deny (the marker)"

        if request.phase == pb.PHASE_RESPONSE:
            redact = REDACTORS.get(request.target.kind)
            if redact is None:
                raise BadCheck(f"target.kind {request.target.kind} is not one this guard knows")
            result = parse_object(request.result_json, "result_json")
            count = redact(result)
            if count == 0:
                return pb.CheckResponse(allow=pb.Allow()), "allow"
            replaced = json.dumps(result, ensure_ascii=False, separators=(",", ":"))
            return (
                pb.CheckResponse(replace=pb.Replace(result_json=replaced)),
                f"replace ({count} e-mail address{'es' if count > 1 else ''})",
            )

        raise BadCheck(f"phase {request.phase} is neither PHASE_REQUEST nor PHASE_RESPONSE")


def log(request: pb.CheckRequest, verdict: str) -> None:
    """One line per check, without arguments or results."""
    phase = pb.Phase.Name(request.phase) if request.phase in pb.Phase.values() else request.phase
    print(
        f"guard: call {request.call_id or '-'} {phase} {request.tenant}/{request.target.name}: {verdict}",
        file=sys.stderr,
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=50070)
    parser.add_argument("--marker", default="DO-NOT-SEND")
    parser.add_argument("--token-env", metavar="VAR")
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    if not args.marker:
        parser.error("--marker must not be empty")
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    token = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            parser.error(f"--token-env: the environment variable {args.token_env} is not set")

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=args.workers),
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
    )
    pb_grpc.add_GuardServiceServicer_to_server(ExampleGuard(args.marker, token), server)
    # Loopback only: put TLS (grpc.ssl_server_credentials) in front before
    # listening anywhere else.
    try:
        port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    except RuntimeError as e:
        sys.exit(f"guard.py: cannot listen on 127.0.0.1:{args.port}: {e}")
    server.start()
    print(f"PORT {port}", flush=True)

    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    stopping.wait()
    server.stop(grace=5).wait()


if __name__ == "__main__":
    main()
