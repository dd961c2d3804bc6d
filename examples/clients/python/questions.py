#!/usr/bin/env python3
"""An example toolgate worker for tools that ask questions and tools that take long.

    pip install -r requirements.txt && ./generate.sh
    TOOLGATE_TOKEN=secret python questions.py ask ask__book_table '{"restaurant": "Chez Rust"}' \\
        --values '{"party_size": 2, "confirm": true}'
    TOOLGATE_TOKEN=secret python questions.py task tasks__slow_report '{"seconds": 1}'

It speaks only toolgate's gRPC API (grpcio and the generated stubs): no MCP
library. The servers behind the gateway may be of any protocol revision;
toolgate turns their questions into the same messages (docs/api.md,
"Questions while a tool runs" and "Tasks").

`ask`: calls the tool over InvokeToolInteractive with `accepts_input`
(form questions only: this worker has no person to send to a URL and no
model for sampling, so toolgate never puts those to it). Every
`input_required` event is answered on the same stream, one InputResponse per
question: a form is filled in from --values (a JSON object of field values;
a field not given takes the schema's default; a required field with neither
declines the form, since a worker must never invent an answer). --decline
declines every form instead.

`task`: calls the tool with `accepts_task`. When the server makes the call a
task, the response carries `task` at once; the worker follows it with
GetTask (waiting `poll_interval_ms` between calls, printing each status
change), answers TASK_STATUS_INPUT_REQUIRED with UpdateTask (forms filled
from --values as above), and prints the result once the task completed.
--cancel-after N calls CancelTask after N seconds. A server that runs the
call inline answers with the result directly.

Arguments:
    ask|task     what to do
    TOOL         the exposed tool name
    ARGS         the arguments as a JSON object (default: {})
    --values     form values, a JSON object (default: {})
    --decline    decline every form
    --addr       the gateway, host:port (default 127.0.0.1:50051); plaintext
    --timeout    deadline of each RPC in seconds (default 60)
    --cancel-after  (task) cancel the task after this many seconds

Output: `question ID form: MESSAGE`, `answer ID accept {...}` per question;
`task ID: STATUS[: MESSAGE]` per status change; then the result as
worker.py prints it (`is_error: ...`, `text: ...`), or `task ID failed: ...`.

Exit codes: 0 a result (also is_error: true); 13 the task failed; 14 the task
was cancelled; the error statuses as worker.py (3 UNAUTHENTICATED, 4
NOT_FOUND, 5 INVALID_ARGUMENT, 6 FAILED_PRECONDITION, 7 RESOURCE_EXHAUSTED,
8 UNAVAILABLE, 9 DEADLINE_EXCEEDED, 11 UNKNOWN, 10 other); 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "gen"))

try:
    import grpc
    from toolgate.v1 import toolgate_pb2 as pb
    from toolgate.v1 import toolgate_pb2_grpc as pb_grpc
    from worker import EXIT_CODES, EXIT_OTHER, ToolError, print_result
except ImportError as e:  # pragma: no cover - a setup problem, said plainly
    sys.exit(
        f"questions.py: cannot import {e.name}: run `pip install -r {HERE / 'requirements.txt'}` "
        f"and `{HERE / 'generate.sh'}` first"
    )

EXIT_TASK_FAILED = 13
EXIT_TASK_CANCELLED = 14
STATUS = {
    pb.TASK_STATUS_WORKING: "working",
    pb.TASK_STATUS_INPUT_REQUIRED: "input_required",
    pb.TASK_STATUS_COMPLETED: "completed",
    pb.TASK_STATUS_FAILED: "failed",
    pb.TASK_STATUS_CANCELLED: "cancelled",
}


def fill_form(form, values: dict, decline: bool) -> tuple[int, dict | None]:
    """The action and content for a form question: --values, else each field's default."""
    if decline:
        return pb.INPUT_ACTION_DECLINE, None
    schema = json.loads(form.requested_schema_json or "{}")
    content = {}
    for name, field in (schema.get("properties") or {}).items():
        if name in values:
            content[name] = values[name]
        elif "default" in field:
            content[name] = field["default"]
        elif name in (schema.get("required") or []):
            # No value for a required field: say no rather than invent one.
            return pb.INPUT_ACTION_DECLINE, None
    return pb.INPUT_ACTION_ACCEPT, content


def answer(asked, values: dict, decline: bool) -> list:
    """One InputResponse per question of an InputRequired."""
    answers = []
    for request in asked.requests:
        kind = request.WhichOneof("kind")
        if kind == "form":
            print(f"question {request.id} form: {request.form.message}", flush=True)
            action, content = fill_form(request.form, values, decline)
        else:
            # Not opted in to, so toolgate does not send it; say no if it does.
            print(f"question {request.id} {kind}: not answered by this worker", flush=True)
            action, content = pb.INPUT_ACTION_DECLINE, None
        name = pb.InputAction.Name(action).removeprefix("INPUT_ACTION_").lower()
        print(f"answer {request.id} {name} {json.dumps(content, sort_keys=True) if content else ''}".rstrip(),
              flush=True)
        answers.append(pb.InputResponse(id=request.id, action=action,
                                        content_json=json.dumps(content) if content is not None else ""))
    return answers


def ask(stub, metadata, args, values: dict) -> int:
    """InvokeToolInteractive: send the call, answer each input_required event, print the result."""
    outgoing: queue.Queue = queue.Queue()
    call = pb.InvokeToolRequest(
        name=args.tool,
        arguments_json=args.args,
        accepts_input=pb.InputCapabilities(form=True),
    )
    outgoing.put(pb.InteractiveRequest(call=call))

    def requests():
        while True:
            message = outgoing.get()
            if message is None:
                return
            yield message

    events = stub.InvokeToolInteractive(requests(), metadata=metadata, timeout=args.timeout)
    try:
        for event in events:
            which = event.WhichOneof("event")
            if which == "input_required":
                for response in answer(event.input_required, values, args.decline):
                    outgoing.put(pb.InteractiveRequest(input_response=response))
            elif which == "progress":
                print(f"progress: {event.progress.progress:g} {event.progress.message}".rstrip(), flush=True)
            elif which == "result":
                print_result(event.result)
                return 0
    finally:
        outgoing.put(None)  # ends the request stream (closing it early cancels the call)
    print("questions.py: the stream ended without a result", file=sys.stderr)
    return EXIT_OTHER


def follow(stub, metadata, args, values: dict, task) -> int:
    """GetTask until the task ends; UpdateTask for its questions; CancelTask after --cancel-after."""
    started = time.monotonic()
    last = None
    for _ in range(100_000):  # bounded: a task expires long before
        line = f"task {task.task_id}: {STATUS.get(task.status, task.status)}"
        if task.status_message:
            line += f": {task.status_message}"
        if line != last:
            print(line, flush=True)
            last = line
        if task.status == pb.TASK_STATUS_COMPLETED:
            print_result(task.result)
            return 0
        if task.status == pb.TASK_STATUS_FAILED:
            print(f"task {task.task_id} failed: {task.status_message}", flush=True)
            return EXIT_TASK_FAILED
        if task.status == pb.TASK_STATUS_CANCELLED:
            print(f"task {task.task_id} cancelled", flush=True)
            return EXIT_TASK_CANCELLED
        if args.cancel_after is not None and time.monotonic() - started >= args.cancel_after:
            task = stub.CancelTask(pb.CancelTaskRequest(task_id=task.task_id),
                                   metadata=metadata, timeout=args.timeout)
            args.cancel_after = None
            continue
        if task.status == pb.TASK_STATUS_INPUT_REQUIRED:
            responses = answer(task.input_required, values, args.decline)
            task = stub.UpdateTask(pb.UpdateTaskRequest(task_id=task.task_id, input_responses=responses),
                                   metadata=metadata, timeout=args.timeout)
            continue
        time.sleep(min(max(task.poll_interval_ms, 50), 5000) / 1000)
        task = stub.GetTask(pb.GetTaskRequest(task_id=task.task_id), metadata=metadata, timeout=args.timeout)
    return EXIT_OTHER


def run_task(stub, metadata, args, values: dict) -> int:
    request = pb.InvokeToolRequest(name=args.tool, arguments_json=args.args, accepts_task=True,
                                   accepts_input=pb.InputCapabilities(form=True))
    response = stub.InvokeTool(request, metadata=metadata, timeout=args.timeout)
    if response.HasField("task"):
        return follow(stub, metadata, args, values, response.task)
    print_result(response)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Answer a tool's form questions; follow a task.")
    parser.add_argument("mode", choices=["ask", "task"])
    parser.add_argument("tool")
    parser.add_argument("args", nargs="?", default="{}")
    parser.add_argument("--values", default="{}")
    parser.add_argument("--decline", action="store_true")
    parser.add_argument("--addr", default="127.0.0.1:50051")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--cancel-after", type=float, default=None)
    args = parser.parse_args(argv)
    try:
        values = json.loads(args.values)
        if not isinstance(values, dict):
            raise ValueError("not an object")
    except ValueError as e:
        print(f"questions.py: --values is not a JSON object: {e}", file=sys.stderr)
        return 2
    token = os.environ.get("TOOLGATE_TOKEN", "")
    metadata = (("authorization", f"Bearer {token}"),)
    with grpc.insecure_channel(args.addr) as channel:
        stub = pb_grpc.ToolGatewayStub(channel)
        try:
            if args.mode == "ask":
                return ask(stub, metadata, args, values)
            return run_task(stub, metadata, args, values)
        except grpc.RpcError as err:
            error = ToolError.from_rpc_error(err)
            print(f"questions.py: {error.describe()}", file=sys.stderr)
            return EXIT_CODES.get(error.code, EXIT_OTHER)


if __name__ == "__main__":
    sys.exit(main())
