// An example toolgate worker for what servers offer besides tools.
//
//   npm ci && npm run build
//   TOOLGATE_TOKEN=secret node dist/offerings.js follow everything__get-resource-links '{"count": 2}'
//   TOOLGATE_TOKEN=secret node dist/offerings.js prompt everything__completable-prompt name=Alice \
//       --complete department=En
//   TOOLGATE_TOKEN=secret node dist/offerings.js watch everything demo://resource/dynamic/text/1 --updates 2
//
// The same as examples/clients/python/offerings.py (read its docstring for the
// details): only toolgate's gRPC API, no MCP library.
//   follow  InvokeTool, then ReadResource(link.server, link.uri) of every
//           resource_link in the result: `link SERVER URI`, `read URI MIME: ...`.
//   prompt  Complete (with --complete ARG=PREFIX; the first value is used), then
//           GetPrompt: `complete ARG: V1, V2`, `[ROLE] TEXT` per message.
//   watch   WatchResource: `watching SERVER URI`, then `update URI` per update
//           until --updates have arrived; --trigger TOOL ARGS calls a tool once
//           the watch is in place.
// Exit codes: 0 done; 2 usage; a failed RPC: 3 UNAUTHENTICATED, 4 NOT_FOUND,
// 5 INVALID_ARGUMENT, 6 FAILED_PRECONDITION, 7 RESOURCE_EXHAUSTED, 8 UNAVAILABLE,
// 9 DEADLINE_EXCEEDED, 11 UNKNOWN, 10 other (as worker.ts).

import * as path from "node:path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

const PROTO_DIR = process.env.TOOLGATE_PROTO_DIR ?? path.resolve(__dirname, "../../../../proto");

// ---- messages, as @grpc/proto-loader gives them (keepCase, enums: String,
// defaults: true, oneofs: true) ------------------------------------------------

interface ResourceLink {
  uri: string;
  name: string;
  server: string;
}
interface EmbeddedResource {
  uri: string;
  server: string;
  mime_type: string;
  contents?: "text" | "blob";
  text?: string;
  blob?: Buffer;
}
interface Content {
  kind?: "text" | "image" | "audio" | "resource_link" | "resource";
  text?: { text: string };
  resource_link?: ResourceLink;
  resource?: EmbeddedResource;
}
interface InvokeToolResponse {
  is_error: boolean;
  text: string;
  content: Content[];
}
interface ResourceContents {
  uri: string;
  mime_type: string;
  data?: "text" | "blob";
  text?: string;
  blob?: Buffer;
}
interface ReadResourceResponse {
  contents: ResourceContents[];
  input_required: unknown | null;
}
interface PromptMessage {
  role: "ROLE_UNSPECIFIED" | "ROLE_USER" | "ROLE_ASSISTANT";
  content: Content;
}
interface GetPromptResponse {
  description: string;
  messages: PromptMessage[];
  input_required: unknown | null;
}
interface CompleteResponse {
  values: string[];
  has_more: boolean;
}
interface ResourceUpdate {
  server: string;
  uri: string;
  initial: boolean;
}

type Unary<Req, Res> = (
  request: Req,
  metadata: grpc.Metadata,
  options: grpc.CallOptions,
  callback: (error: grpc.ServiceError | null, response?: Res) => void,
) => grpc.ClientUnaryCall;

interface ToolGatewayClient extends grpc.Client {
  InvokeTool: Unary<{ name: string; arguments_json: string }, InvokeToolResponse>;
  ReadResource: Unary<{ server: string; uri: string }, ReadResourceResponse>;
  Complete: Unary<
    { prompt: string; argument_name: string; value: string; context_arguments: Record<string, string> },
    CompleteResponse
  >;
  GetPrompt: Unary<{ name: string; arguments: Record<string, string> }, GetPromptResponse>;
  WatchResource(
    request: { server: string; uri: string },
    metadata: grpc.Metadata,
    options: grpc.CallOptions,
  ): grpc.ClientReadableStream<ResourceUpdate>;
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

class Failed extends Error {
  constructor(
    message: string,
    readonly exitCode: number,
  ) {
    super(message);
  }
}

interface Args {
  mode: "follow" | "prompt" | "watch";
  name: string;
  rest: string[];
  complete: string | null;
  updates: number;
  trigger: [string, string] | null;
  addr: string;
  timeout: number;
}

const USAGE =
  "usage: offerings (follow TOOL [ARGS] | prompt NAME [KEY=VALUE...] [--complete ARG=PREFIX] | " +
  "watch SERVER URI [--updates N] [--trigger TOOL ARGS]) [--addr HOST:PORT] [--timeout S]";

function parseArgs(argv: string[]): Args {
  const positional: string[] = [];
  let complete: string | null = null;
  let updates = 1;
  let trigger: [string, string] | null = null;
  let addr = "127.0.0.1:50051";
  let timeout = 60;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new Failed(`${a} needs a value\n${USAGE}`, 2);
      return argv[++i];
    };
    if (a === "--complete") complete = value();
    else if (a === "--updates") updates = Number(value());
    else if (a === "--trigger") trigger = [value(), value()];
    else if (a === "--addr") addr = value();
    else if (a === "--timeout") timeout = Number(value());
    else if (a.startsWith("--")) throw new Failed(`unknown option ${a}\n${USAGE}`, 2);
    else positional.push(a);
  }
  const [mode, name, ...rest] = positional;
  if ((mode !== "follow" && mode !== "prompt" && mode !== "watch") || !name) throw new Failed(USAGE, 2);
  return { mode, name, rest, complete, updates, trigger, addr, timeout };
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

const firstLine = (text: string) => text.split("\n")[0] ?? "";

/** InvokeTool, then ReadResource of every resource link in the result. */
async function follow(client: ToolGatewayClient, args: Args): Promise<number> {
  const result = await unary(
    client,
    client.InvokeTool,
    { name: args.name, arguments_json: args.rest[0] ?? "{}" },
    args.timeout,
  );
  const links = result.content.filter((c) => c.kind === "resource_link").map((c) => c.resource_link!);
  if (links.length === 0) console.log("the result holds no resource link");
  for (const link of links) {
    // The link names the server whose tool returned it: pass both on.
    console.log(`link ${link.server} ${link.uri}`);
    const read = await unary(client, client.ReadResource, { server: link.server, uri: link.uri }, args.timeout);
    if (read.input_required) {
      console.log(`read ${link.uri}: the server asks questions first`);
      continue;
    }
    for (const part of read.contents) {
      const what = part.data === "blob" ? `${part.blob!.length} bytes` : firstLine(part.text ?? "");
      console.log(`read ${part.uri || link.uri} ${part.mime_type || "-"}: ${what}`);
    }
  }
  return 0;
}

function keyValues(pairs: string[]): Record<string, string> {
  const values: Record<string, string> = {};
  for (const pair of pairs) {
    const at = pair.indexOf("=");
    if (at < 0) throw new Failed(`\`${pair}\` is not KEY=VALUE`, 2);
    values[pair.slice(0, at)] = pair.slice(at + 1);
  }
  return values;
}

/** Complete (optionally), then GetPrompt, then print the messages. */
async function prompt(client: ToolGatewayClient, args: Args): Promise<number> {
  const argumentsMap = keyValues(args.rest);
  if (args.complete) {
    const at = args.complete.indexOf("=");
    const argument = at < 0 ? args.complete : args.complete.slice(0, at);
    const prefix = at < 0 ? "" : args.complete.slice(at + 1);
    const completion = await unary(
      client,
      client.Complete,
      { prompt: args.name, argument_name: argument, value: prefix, context_arguments: argumentsMap },
      args.timeout,
    );
    console.log(`complete ${argument}: ${completion.values.join(", ")}`);
    if (completion.values.length === 0) throw new Failed(`no value completes ${argument}=${prefix}`, EXIT_OTHER);
    argumentsMap[argument] = completion.values[0];
  }
  const rendered = await unary(client, client.GetPrompt, { name: args.name, arguments: argumentsMap }, args.timeout);
  if (rendered.input_required) throw new Failed("the server asks questions before it renders this prompt", EXIT_OTHER);
  for (const message of rendered.messages) {
    const role = message.role === "ROLE_ASSISTANT" ? "assistant" : "user";
    const c = message.content;
    if (c.kind === "text") console.log(`[${role}] ${c.text!.text}`);
    else if (c.kind === "resource") {
      const r = c.resource!;
      const text = r.contents === "blob" ? `${r.blob!.length} bytes` : firstLine(r.text ?? "");
      console.log(`[${role}] resource ${r.uri} of ${r.server}: ${text}`);
    } else if (c.kind === "resource_link") console.log(`[${role}] link ${c.resource_link!.server} ${c.resource_link!.uri}`);
    else console.log(`[${role}] (${c.kind})`);
  }
  return 0;
}

/** WatchResource until --updates updates have arrived. */
function watch(client: ToolGatewayClient, args: Args): Promise<number> {
  const [uri] = args.rest;
  if (!uri) throw new Failed(USAGE, 2);
  return new Promise((resolve, reject) => {
    const stream = client.WatchResource({ server: args.name, uri }, metadata(), {
      deadline: Date.now() + args.timeout * 1000,
    });
    let seen = 0;
    let done = false;
    stream.on("data", (update: ResourceUpdate) => {
      if (update.initial) {
        console.log(`watching ${args.name} ${uri}`);
        if (args.trigger) {
          const [tool, triggerArgs] = args.trigger;
          unary(client, client.InvokeTool, { name: tool, arguments_json: triggerArgs }, args.timeout).catch(reject);
        }
        return;
      }
      console.log(`update ${update.uri}`);
      seen += 1;
      if (seen >= args.updates && !done) {
        done = true;
        stream.cancel(); // the gateway unsubscribes once the last watcher leaves
        resolve(0);
      }
    });
    stream.on("error", (err: grpc.ServiceError) => (done ? undefined : reject(err)));
    stream.on("end", () => {
      if (!done) reject(new Failed("the stream ended before the updates arrived", EXIT_OTHER));
    });
  });
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
      console.error(`offerings: ${e.message}`);
      return e.exitCode;
    }
    throw e;
  }
  const client = loadClient(args.addr);
  try {
    if (args.mode === "follow") return await follow(client, args);
    if (args.mode === "prompt") return await prompt(client, args);
    return await watch(client, args);
  } catch (e) {
    if (e instanceof Failed) {
      console.error(`offerings: ${e.message}`);
      return e.exitCode;
    }
    const err = e as grpc.ServiceError;
    if (typeof err.code === "number") {
      console.error(`offerings: ${grpc.status[err.code]}: ${err.details}`);
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
    console.error(`offerings: unexpected failure: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}`);
    process.exitCode = 1;
  },
);
