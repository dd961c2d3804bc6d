// An example toolgate worker for tools that ask questions and tools that take long.
//
//   npm ci && npm run build
//   TOOLGATE_TOKEN=secret node dist/questions.js ask ask__book_table '{"restaurant": "Chez Rust"}' \
//       --values '{"party_size": 2, "confirm": true}'
//   TOOLGATE_TOKEN=secret node dist/questions.js task tasks__slow_report '{"seconds": 1}'
//
// The same as examples/clients/python/questions.py (read its docstring for the
// details): only toolgate's gRPC API, no MCP library.
//   ask   InvokeToolInteractive with accepts_input.form: each input_required
//         event is answered on the stream, forms filled from --values (else each
//         field's default; a required field with neither declines the form).
//   task  InvokeTool with accepts_task: the task is followed with GetTask
//         (poll_interval_ms apart), its questions answered with UpdateTask, and
//         --cancel-after S calls CancelTask.
// Output: `question ID form: MESSAGE`, `answer ID ACTION {...}`, `task ID: STATUS[: MESSAGE]`
// per status change, then `is_error: ...` and `text: ...`.
// Exit codes: 0 a result; 13 the task failed; 14 it was cancelled; 2 usage;
// a failed RPC: 3 UNAUTHENTICATED, 4 NOT_FOUND, 5 INVALID_ARGUMENT,
// 6 FAILED_PRECONDITION, 7 RESOURCE_EXHAUSTED, 8 UNAVAILABLE, 9 DEADLINE_EXCEEDED,
// 11 UNKNOWN, 10 other (as worker.ts).

import * as path from "node:path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

const PROTO_DIR = process.env.TOOLGATE_PROTO_DIR ?? path.resolve(__dirname, "../../../../proto");

// ---- messages, as @grpc/proto-loader gives them (keepCase, enums: String,
// defaults: true, oneofs: true) ------------------------------------------------

interface FormInput {
  message: string;
  requested_schema_json: string;
}
interface InputRequest {
  id: string;
  kind?: "form" | "url" | "sampling";
  form?: FormInput;
}
interface InputRequired {
  requests: InputRequest[];
  request_state: string;
}
type InputAction = "INPUT_ACTION_ACCEPT" | "INPUT_ACTION_DECLINE" | "INPUT_ACTION_CANCEL";
interface InputResponse {
  id: string;
  action: InputAction;
  content_json: string;
}
interface InvokeToolResponse {
  is_error: boolean;
  text: string;
  input_required: InputRequired | null;
  task: Task | null;
}
type TaskStatus =
  | "TASK_STATUS_UNSPECIFIED"
  | "TASK_STATUS_WORKING"
  | "TASK_STATUS_INPUT_REQUIRED"
  | "TASK_STATUS_COMPLETED"
  | "TASK_STATUS_FAILED"
  | "TASK_STATUS_CANCELLED";
interface Task {
  task_id: string;
  status: TaskStatus;
  status_message: string;
  poll_interval_ms: number;
  result: InvokeToolResponse | null;
  input_required: InputRequired | null;
}
interface InvokeToolRequest {
  name: string;
  arguments_json: string;
  accepts_input?: { form: boolean; url: boolean; sampling: boolean };
  accepts_task?: boolean;
}
interface InvokeToolEvent {
  event?: "progress" | "result" | "input_required";
  progress?: { progress: number; message: string };
  result?: InvokeToolResponse;
  input_required?: InputRequired;
}
type InteractiveRequest = { call: InvokeToolRequest } | { input_response: InputResponse };

type Unary<Req, Res> = (
  request: Req,
  metadata: grpc.Metadata,
  options: grpc.CallOptions,
  callback: (error: grpc.ServiceError | null, response?: Res) => void,
) => grpc.ClientUnaryCall;

interface ToolGatewayClient extends grpc.Client {
  InvokeTool: Unary<InvokeToolRequest, InvokeToolResponse>;
  InvokeToolInteractive(
    metadata: grpc.Metadata,
    options: grpc.CallOptions,
  ): grpc.ClientDuplexStream<InteractiveRequest, InvokeToolEvent>;
  GetTask: Unary<{ task_id: string }, Task>;
  UpdateTask: Unary<{ task_id: string; input_responses: InputResponse[] }, Task>;
  CancelTask: Unary<{ task_id: string }, Task>;
}

const EXIT_CODES: Partial<Record<grpc.status, number>> = {
  [grpc.status.UNAUTHENTICATED]: 3,
  [grpc.status.NOT_FOUND]: 4,
  [grpc.status.INVALID_ARGUMENT]: 5,
  [grpc.status.FAILED_PRECONDITION]: 6,
  [grpc.status.RESOURCE_EXHAUSTED]: 7,
  [grpc.status.UNAVAILABLE]: 8,
  [grpc.status.DEADLINE_EXCEEDED]: 9,
  [grpc.status.UNKNOWN]: 11,
};
const EXIT_OTHER = 10;
const EXIT_TASK_FAILED = 13;
const EXIT_TASK_CANCELLED = 14;

class Failed extends Error {
  constructor(
    message: string,
    readonly exitCode: number,
  ) {
    super(message);
  }
}

interface Args {
  mode: "ask" | "task";
  tool: string;
  args: string;
  values: Record<string, unknown>;
  decline: boolean;
  addr: string;
  timeout: number;
  cancelAfter: number | null;
}

const USAGE =
  "usage: questions (ask|task) TOOL [ARGS] [--values JSON] [--decline] [--addr HOST:PORT] [--timeout S] [--cancel-after S]";

function parseArgs(argv: string[]): Args {
  const positional: string[] = [];
  let values = "{}";
  let decline = false;
  let addr = "127.0.0.1:50051";
  let timeout = 60;
  let cancelAfter: number | null = null;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new Failed(`${a} needs a value\n${USAGE}`, 2);
      return argv[++i];
    };
    if (a === "--values") values = value();
    else if (a === "--decline") decline = true;
    else if (a === "--addr") addr = value();
    else if (a === "--timeout") timeout = Number(value());
    else if (a === "--cancel-after") cancelAfter = Number(value());
    else if (a.startsWith("--")) throw new Failed(`unknown option ${a}\n${USAGE}`, 2);
    else positional.push(a);
  }
  const [mode, tool, args] = positional;
  if ((mode !== "ask" && mode !== "task") || !tool || positional.length > 3) throw new Failed(USAGE, 2);
  let parsed: unknown;
  try {
    parsed = JSON.parse(values);
  } catch {
    parsed = null;
  }
  if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) {
    throw new Failed("--values is not a JSON object", 2);
  }
  return {
    mode,
    tool,
    args: args ?? "{}",
    values: parsed as Record<string, unknown>,
    decline,
    addr,
    timeout,
    cancelAfter,
  };
}

/** The action and content for a form: --values, else each field's default. */
function fillForm(form: FormInput, values: Record<string, unknown>, decline: boolean): [InputAction, unknown] {
  if (decline) return ["INPUT_ACTION_DECLINE", null];
  const schema = JSON.parse(form.requested_schema_json || "{}") as {
    properties?: Record<string, { default?: unknown }>;
    required?: string[];
  };
  const content: Record<string, unknown> = {};
  for (const [name, field] of Object.entries(schema.properties ?? {})) {
    if (name in values) content[name] = values[name];
    else if (field.default !== undefined) content[name] = field.default;
    // No value for a required field: say no rather than invent one.
    else if ((schema.required ?? []).includes(name)) return ["INPUT_ACTION_DECLINE", null];
  }
  return ["INPUT_ACTION_ACCEPT", content];
}

/** One InputResponse per question. */
function answer(asked: InputRequired, args: Args): InputResponse[] {
  return asked.requests.map((request) => {
    let action: InputAction = "INPUT_ACTION_DECLINE";
    let content: unknown = null;
    if (request.kind === "form" && request.form) {
      console.log(`question ${request.id} form: ${request.form.message}`);
      [action, content] = fillForm(request.form, args.values, args.decline);
    } else {
      // Not opted in to, so toolgate does not send it; say no if it does.
      console.log(`question ${request.id} ${request.kind}: not answered by this worker`);
    }
    const name = action.replace("INPUT_ACTION_", "").toLowerCase();
    console.log(`answer ${request.id} ${name}${content ? " " + JSON.stringify(content) : ""}`);
    return { id: request.id, action, content_json: content ? JSON.stringify(content) : "" };
  });
}

function printResult(response: InvokeToolResponse): void {
  console.log(`is_error: ${response.is_error}`);
  console.log("text: " + response.text.replace(/\n/g, "\n      "));
}

function metadata(): grpc.Metadata {
  const m = new grpc.Metadata();
  m.set("authorization", `Bearer ${process.env.TOOLGATE_TOKEN ?? ""}`);
  return m;
}

function unary<Req, Res>(client: ToolGatewayClient, rpc: Unary<Req, Res>, request: Req, timeout: number): Promise<Res> {
  return new Promise((resolve, reject) =>
    rpc.call(client, request, metadata(), { deadline: Date.now() + timeout * 1000 }, (err, res) =>
      err ? reject(err) : resolve(res!),
    ),
  );
}

/** InvokeToolInteractive: send the call, answer each input_required event, print the result. */
function ask(client: ToolGatewayClient, args: Args): Promise<number> {
  return new Promise((resolve, reject) => {
    const stream = client.InvokeToolInteractive(metadata(), { deadline: Date.now() + args.timeout * 1000 });
    let done = false;
    stream.on("data", (event: InvokeToolEvent) => {
      if (event.event === "input_required") {
        for (const response of answer(event.input_required!, args)) stream.write({ input_response: response });
      } else if (event.event === "progress") {
        console.log(`progress: ${event.progress!.progress} ${event.progress!.message}`.trimEnd());
      } else if (event.event === "result") {
        done = true;
        printResult(event.result!);
        stream.end();
        resolve(0);
      }
    });
    stream.on("error", (err: grpc.ServiceError) => (done ? undefined : reject(err)));
    stream.on("end", () => {
      if (!done) reject(new Failed("the stream ended without a result", EXIT_OTHER));
    });
    stream.write({
      call: { name: args.tool, arguments_json: args.args, accepts_input: { form: true, url: false, sampling: false } },
    });
  });
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** GetTask until the task ends; UpdateTask for its questions; CancelTask after --cancel-after. */
async function follow(client: ToolGatewayClient, args: Args, first: Task): Promise<number> {
  const started = Date.now();
  let task = first;
  let last = "";
  for (let i = 0; i < 100_000; i++) {
    const line = `task ${task.task_id}: ${task.status.replace("TASK_STATUS_", "").toLowerCase()}${task.status_message ? ": " + task.status_message : ""}`;
    if (line !== last) console.log(line);
    last = line;
    switch (task.status) {
      case "TASK_STATUS_COMPLETED":
        printResult(task.result!);
        return 0;
      case "TASK_STATUS_FAILED":
        console.log(`task ${task.task_id} failed: ${task.status_message}`);
        return EXIT_TASK_FAILED;
      case "TASK_STATUS_CANCELLED":
        console.log(`task ${task.task_id} cancelled`);
        return EXIT_TASK_CANCELLED;
    }
    if (args.cancelAfter !== null && Date.now() - started >= args.cancelAfter * 1000) {
      args.cancelAfter = null;
      task = await unary(client, client.CancelTask, { task_id: task.task_id }, args.timeout);
    } else if (task.status === "TASK_STATUS_INPUT_REQUIRED") {
      const input_responses = answer(task.input_required!, args);
      task = await unary(client, client.UpdateTask, { task_id: task.task_id, input_responses }, args.timeout);
    } else {
      await sleep(Math.min(Math.max(task.poll_interval_ms, 50), 5000));
      task = await unary(client, client.GetTask, { task_id: task.task_id }, args.timeout);
    }
  }
  return EXIT_OTHER;
}

async function runTask(client: ToolGatewayClient, args: Args): Promise<number> {
  const response = await unary(
    client,
    client.InvokeTool,
    {
      name: args.tool,
      arguments_json: args.args,
      accepts_task: true,
      accepts_input: { form: true, url: false, sampling: false },
    },
    args.timeout,
  );
  if (response.task) return follow(client, args, response.task);
  printResult(response);
  return 0;
}

function loadClient(addr: string): ToolGatewayClient {
  const definition = protoLoader.loadSync("toolgate/v1/toolgate.proto", {
    includeDirs: [PROTO_DIR],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const pkg = grpc.loadPackageDefinition(definition) as unknown as {
    toolgate: { v1: { ToolGateway: new (addr: string, creds: grpc.ChannelCredentials) => ToolGatewayClient } };
  };
  return new pkg.toolgate.v1.ToolGateway(addr, grpc.credentials.createInsecure());
}

async function main(): Promise<number> {
  let args: Args;
  try {
    args = parseArgs(process.argv.slice(2));
  } catch (e) {
    if (e instanceof Failed) {
      console.error(`questions: ${e.message}`);
      return e.exitCode;
    }
    throw e;
  }
  const client = loadClient(args.addr);
  try {
    return await (args.mode === "ask" ? ask(client, args) : runTask(client, args));
  } catch (e) {
    if (e instanceof Failed) {
      console.error(`questions: ${e.message}`);
      return e.exitCode;
    }
    const err = e as grpc.ServiceError;
    if (typeof err.code === "number") {
      console.error(`questions: ${grpc.status[err.code]}: ${err.details}`);
      return EXIT_CODES[err.code as grpc.status] ?? EXIT_OTHER;
    }
    throw e;
  } finally {
    client.close();
  }
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (e: unknown) => {
    console.error(`questions: unexpected failure: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}`);
    process.exitCode = 1;
  },
);
