#!/usr/bin/env python3
"""An example toolgate worker for what servers offer besides tools.

    pip install -r requirements.txt && ./generate.sh
    TOOLGATE_TOKEN=secret python offerings.py follow everything__get-resource-links '{"count": 2}'
    TOOLGATE_TOKEN=secret python offerings.py prompt everything__completable-prompt name=Alice \\
        --complete department=En
    TOOLGATE_TOKEN=secret python offerings.py watch everything demo://resource/dynamic/text/1 --updates 2

It speaks only toolgate's gRPC API (grpcio and the generated stubs): no MCP
library. The servers behind the gateway may speak either protocol revision
(docs/api.md, "Resources", "Prompts", "Completion", "Watching a resource").

`follow`: calls a tool, and for every `resource_link` in its result reads
the linked resource with ReadResource, passing the link's `server` and `uri`
unchanged: `link SERVER URI`, then `read URI MIME: FIRST LINE` for text or
`read URI MIME: N bytes` for binary contents.

`prompt`: renders a prompt. With --complete ARG=PREFIX it first asks
Complete for values of ARG starting from PREFIX, with the other arguments as
context, and uses the first value: `complete ARG: V1, V2, ...`. Then
GetPrompt with every argument, and each message as `[ROLE] TEXT`
(embedded resources as `[ROLE] resource URI of SERVER: FIRST LINE`).

`watch`: WatchResource on SERVER URI: `watching SERVER URI` once the
subscription is in place, then `update URI` per update until --updates
have arrived (then the worker ends the stream). --trigger TOOL ARGS calls a
tool once the watch is in place (to make the server change something).

Arguments:
    follow TOOL [ARGS]                        ARGS a JSON object (default {})
    prompt NAME [KEY=VALUE...] [--complete ARG=PREFIX]   (KEY=VALUE before the options)
    watch SERVER URI [--updates N] [--trigger TOOL ARGS]
    --addr       the gateway, host:port (default 127.0.0.1:50051); plaintext
    --timeout    deadline of each RPC in seconds (default 60)

Exit codes: 0 done; the error statuses as worker.py (3 UNAUTHENTICATED, 4
NOT_FOUND, 5 INVALID_ARGUMENT, 6 FAILED_PRECONDITION, 7 RESOURCE_EXHAUSTED,
8 UNAVAILABLE, 9 DEADLINE_EXCEEDED, 11 UNKNOWN, 10 other); 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "gen"))

try:
    import grpc
    from toolgate.v1 import toolgate_pb2 as pb
    from toolgate.v1 import toolgate_pb2_grpc as pb_grpc
    from worker import EXIT_CODES, EXIT_OTHER, ToolError
except ImportError as e:  # pragma: no cover - a setup problem, said plainly
    sys.exit(
        f"offerings.py: cannot import {e.name}: run `pip install -r {HERE / 'requirements.txt'}` "
        f"and `{HERE / 'generate.sh'}` first"
    )

ROLES = {pb.ROLE_USER: "user", pb.ROLE_ASSISTANT: "assistant"}


def first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def describe_contents(uri: str, read) -> None:
    """One line per part of a ReadResourceResponse."""
    for part in read.contents:
        mime = part.mime_type or "-"
        if part.WhichOneof("data") == "blob":
            print(f"read {part.uri or uri} {mime}: {len(part.blob)} bytes", flush=True)
        else:
            print(f"read {part.uri or uri} {mime}: {first_line(part.text)}", flush=True)


def follow(stub, metadata, args) -> int:
    """InvokeTool, then ReadResource of every resource link in the result."""
    result = stub.InvokeTool(pb.InvokeToolRequest(name=args.name, arguments_json=args.rest[0] if args.rest else "{}"),
                             metadata=metadata, timeout=args.timeout)
    links = [c.resource_link for c in result.content if c.WhichOneof("kind") == "resource_link"]
    if not links:
        print("the result holds no resource link", flush=True)
    for link in links:
        # The link names the server whose tool returned it: pass both on.
        print(f"link {link.server} {link.uri}", flush=True)
        read = stub.ReadResource(pb.ReadResourceRequest(server=link.server, uri=link.uri),
                                 metadata=metadata, timeout=args.timeout)
        if read.HasField("input_required"):
            print(f"read {link.uri}: the server asks questions first", flush=True)
            continue
        describe_contents(link.uri, read)
    return 0


def key_values(pairs: list[str]) -> dict[str, str]:
    values = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"`{pair}` is not KEY=VALUE")
        values[key] = value
    return values


def prompt(stub, metadata, args) -> int:
    """Complete (optionally), then GetPrompt, then print the messages."""
    arguments = key_values(args.rest)
    if args.complete:
        argument, _, prefix = args.complete.partition("=")
        completion = stub.Complete(
            pb.CompleteRequest(prompt=args.name, argument_name=argument, value=prefix,
                               context_arguments=arguments),
            metadata=metadata, timeout=args.timeout)
        print(f"complete {argument}: {', '.join(completion.values)}", flush=True)
        if not completion.values:
            print(f"offerings.py: no value completes {argument}={prefix!r}", file=sys.stderr)
            return EXIT_OTHER
        arguments[argument] = completion.values[0]
    rendered = stub.GetPrompt(pb.GetPromptRequest(name=args.name, arguments=arguments),
                              metadata=metadata, timeout=args.timeout)
    if rendered.HasField("input_required"):
        print("the server asks questions before it renders this prompt", flush=True)
        return EXIT_OTHER
    for message in rendered.messages:
        role = ROLES.get(message.role, "user")
        kind = message.content.WhichOneof("kind")
        if kind == "text":
            print(f"[{role}] {message.content.text.text}", flush=True)
        elif kind == "resource":
            embedded = message.content.resource
            text = embedded.text if embedded.WhichOneof("contents") == "text" else f"{len(embedded.blob)} bytes"
            print(f"[{role}] resource {embedded.uri} of {embedded.server}: {first_line(text)}", flush=True)
        elif kind == "resource_link":
            link = message.content.resource_link
            print(f"[{role}] link {link.server} {link.uri}", flush=True)
        else:
            print(f"[{role}] ({kind})", flush=True)
    return 0


def watch(stub, metadata, args) -> int:
    """WatchResource until --updates updates have arrived."""
    if not args.rest:
        print("offerings.py: watch needs SERVER URI", file=sys.stderr)
        return 2
    server, uri = args.name, args.rest[0]
    stream = stub.WatchResource(pb.WatchResourceRequest(server=server, uri=uri),
                                metadata=metadata, timeout=args.timeout)
    seen = 0
    try:
        for update in stream:
            if update.initial:
                print(f"watching {server} {uri}", flush=True)
                if args.trigger:
                    tool, trigger_args = args.trigger
                    stub.InvokeTool(pb.InvokeToolRequest(name=tool, arguments_json=trigger_args),
                                    metadata=metadata, timeout=args.timeout)
                continue
            print(f"update {update.uri}", flush=True)
            seen += 1
            if seen >= args.updates:
                return 0
    finally:
        stream.cancel()  # the gateway unsubscribes once the last watcher leaves
    print("offerings.py: the stream ended before the updates arrived", file=sys.stderr)
    return EXIT_OTHER


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Follow resource links, render prompts, watch resources.")
    parser.add_argument("mode", choices=["follow", "prompt", "watch"])
    parser.add_argument("name", help="the tool (follow), the prompt (prompt) or the server (watch)")
    parser.add_argument("rest", nargs="*", help="ARGS (follow), KEY=VALUE... (prompt), URI (watch)")
    parser.add_argument("--complete", default=None, metavar="ARG=PREFIX")
    parser.add_argument("--updates", type=int, default=1)
    parser.add_argument("--trigger", nargs=2, default=None, metavar=("TOOL", "ARGS"))
    parser.add_argument("--addr", default="127.0.0.1:50051")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    token = os.environ.get("TOOLGATE_TOKEN", "")
    metadata = (("authorization", f"Bearer {token}"),)
    with grpc.insecure_channel(args.addr) as channel:
        stub = pb_grpc.ToolGatewayStub(channel)
        try:
            if args.mode == "follow":
                return follow(stub, metadata, args)
            if args.mode == "prompt":
                return prompt(stub, metadata, args)
            return watch(stub, metadata, args)
        except ValueError as e:
            print(f"offerings.py: {e}", file=sys.stderr)
            return 2
        except grpc.RpcError as err:
            error = ToolError.from_rpc_error(err)
            print(f"offerings.py: {error.describe()}", file=sys.stderr)
            return EXIT_CODES.get(error.code, EXIT_OTHER)


if __name__ == "__main__":
    sys.exit(main())
