// An example toolgate worker: list the tenant's tools, invoke one, read the result.
//
//   npm ci && npm run build
//   TOOLGATE_TOKEN=secret npm start -- --addr 127.0.0.1:50051 py__add '{"a": 2, "b": 3}'
//
// Arguments (the same as examples/clients/python/worker.py):
//   TOOL        the exposed tool name to invoke (default: the first listed tool
//               whose input schema requires no argument)
//   ARGS        the arguments as a JSON object (default: {})
//   --addr      the gateway, host:port (default 127.0.0.1:50051); plaintext
//   --timeout   deadline of each RPC in seconds (default 30)
//   --retries   retries of a call shed, or refused as UNAVAILABLE (default 3)
//   --catalog-version, --definition-hash
//               pins of a plan made earlier (default: those of the listing this
//               run just made). A stale pin is answered FAILED_PRECONDITION; the
//               worker then lists again and retries once with the new pins.
//
// The token comes from TOOLGATE_TOKEN and is sent as `authorization: Bearer <token>`.
// The proto is loaded at run time from <repo>/proto (override: TOOLGATE_PROTO_DIR).
//
// Errors are decoded from `grpc-status-details-bin` (google.rpc.Status holding
// google.rpc.ErrorInfo and RetryInfo; see docs/errors.md) and handled by status:
//   UNAUTHENTICATED     no retry: fix the token                              exit 3
//   NOT_FOUND           no retry: the tool is not in the catalog             exit 4
//   INVALID_ARGUMENT    no retry: fix the arguments (message is for a model)  exit 5
//   FAILED_PRECONDITION pins outdated: list again, retry once with new pins;
//                       UPSTREAM_AUTH_REJECTED (and other reasons): no
//                       retry, alert an operator                             exit 6
//   RESOURCE_EXHAUSTED  sheds: retry after RetryInfo (or backoff), bounded;
//                       size limits: no retry                                exit 7
//   UNAVAILABLE         nothing reached the tool: retry after RetryInfo (or
//                       backoff when the gateway cannot be reached), bounded  exit 8
//   DEADLINE_EXCEEDED   no retry: the tool may have partly run               exit 9
//   UNKNOWN             never retried: the call may have reached the tool
//                       and its outcome is unknown (UPSTREAM_CONNECTION_LOST,
//                       UPSTREAM_HTTP_ERROR, SHUTTING_DOWN): the tool may
//                       have acted                                           exit 11
//   anything else       no retry                                             exit 10
// Exit 0 when the call returned a result, including one with is_error = true
// (the tool ran and reported failure: a successful RPC whose text is meant for
// the model; printed as `is_error: true`). Exit 2 for a usage error.

import * as path from "node:path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import * as protobuf from "protobufjs";

const PROTO_DIR = process.env.TOOLGATE_PROTO_DIR ?? path.resolve(__dirname, "../../../../proto");
const RPC_PROTO_DIR = path.resolve(__dirname, "../proto");

// ---- messages, as @grpc/proto-loader gives them (keepCase, longs: String,
// enums: String, defaults: true, oneofs: true) --------------------------------

interface ToolAnnotations {
  // proto3 `optional`: the virtual oneof `_<name>` is set only when the hint is present.
  read_only_hint: boolean;
  destructive_hint: boolean;
  idempotent_hint: boolean;
  open_world_hint: boolean;
  [virtualOneof: string]: unknown;
}
interface Tool {
  name: string;
  server: string;
  description: string;
  title: string;
  input_schema_json: string;
  output_schema_json: string;
  annotations: ToolAnnotations | null;
  upstream_name: string;
  definition_hash: string;
  schema_bytes: number;
  estimated_tokens: number;
}
interface ServerStatus {
  name: string;
  connected: boolean;
  error: string;
  tool_count: number;
  transport: string;
  state: string;
}
interface ListToolsResponse {
  tools: Tool[];
  catalog_version: string;
  servers: ServerStatus[];
  total_estimated_tokens: number;
}
interface Media {
  data: Buffer;
  mime_type: string;
}
interface Content {
  kind?: "text" | "image" | "audio" | "resource_link" | "resource";
  text?: { text: string };
  image?: Media;
  audio?: Media;
  resource_link?: {
    uri: string;
    name: string;
    title: string;
    description: string;
    mime_type: string;
    size: string; // uint64, as a string (longs: String)
    _size?: "size";
  };
  resource?: { uri: string; mime_type: string; contents?: "text" | "blob"; text?: string; blob?: Buffer };
}
interface InvokeToolRequest {
  name: string;
  arguments_json: string;
  catalog_version: string;
  definition_hash: string;
}
interface InvokeToolResponse {
  is_error: boolean;
  text: string;
  content: Content[];
  structured_content_json: string;
}

type Unary<Req, Res> = (
  request: Req,
  metadata: grpc.Metadata,
  options: grpc.CallOptions,
  callback: (error: grpc.ServiceError | null, response?: Res) => void,
) => grpc.ClientUnaryCall;

interface ToolGatewayClient extends grpc.Client {
  ListTools: Unary<Record<string, never>, ListToolsResponse>;
  InvokeTool: Unary<InvokeToolRequest, InvokeToolResponse>;
}

// ---- errors ----------------------------------------------------------------

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
/** FAILED_PRECONDITION reasons that mean "the plan's pins are outdated". */
const PIN_REASONS = new Set(["TOOL_DEFINITION_CHANGED", "TOOL_GONE", "CATALOG_VERSION_UNKNOWN"]);
/** RESOURCE_EXHAUSTED reasons where nothing was sent upstream (load sheds). */
const SHED_REASONS = new Set(["RATE_LIMITED", "TENANT_CONCURRENCY_LIMIT", "SERVER_CONCURRENCY_LIMIT"]);
const MAX_DELAY = 10; // seconds; never sleep longer between two attempts

/** A gRPC error with toolgate's details decoded. */
interface ToolError {
  code: grpc.status;
  message: string;
  reason: string | null; // ErrorInfo.reason; null when the status has no ErrorInfo
  metadata: Record<string, string>;
  retryDelay: number | null; // RetryInfo.retry_delay, seconds
}

/** Ends the run with a message and an exit code. */
class Failed extends Error {
  constructor(
    message: string,
    readonly exitCode: number,
  ) {
    super(message);
  }
}

/** An RPC that failed for good, after `attempts` retries. */
class RpcFailed extends Error {
  constructor(
    readonly error: ToolError,
    readonly attempts: number,
  ) {
    super(describe(error));
  }
}

// keepCase: field names as in the .proto (retry_delay, type_url), as for the toolgate messages.
const rpcRoot = new protobuf.Root().loadSync(
  [path.join(RPC_PROTO_DIR, "google/rpc/status.proto"), path.join(RPC_PROTO_DIR, "google/rpc/error_details.proto")],
  { keepCase: true },
);
const StatusType = rpcRoot.lookupType("google.rpc.Status");
const ErrorInfoType = rpcRoot.lookupType("google.rpc.ErrorInfo");
const RetryInfoType = rpcRoot.lookupType("google.rpc.RetryInfo");

function toolError(err: grpc.ServiceError): ToolError {
  const out: ToolError = { code: err.code, message: err.details ?? "", reason: null, metadata: {}, retryDelay: null };
  for (const value of err.metadata?.get("grpc-status-details-bin") ?? []) {
    const status = StatusType.toObject(StatusType.decode(value as Buffer), { longs: String }) as {
      details?: { type_url: string; value: Uint8Array }[];
    };
    for (const detail of status.details ?? []) {
      const typeName = detail.type_url.slice(detail.type_url.lastIndexOf("/") + 1);
      if (typeName === "google.rpc.ErrorInfo") {
        const info = ErrorInfoType.toObject(ErrorInfoType.decode(detail.value)) as {
          reason?: string;
          metadata?: Record<string, string>;
        };
        out.reason = info.reason ?? "";
        out.metadata = info.metadata ?? {};
      } else if (typeName === "google.rpc.RetryInfo") {
        const retry = RetryInfoType.toObject(RetryInfoType.decode(detail.value), { longs: Number }) as {
          retry_delay?: { seconds?: number; nanos?: number };
        };
        out.retryDelay = (retry.retry_delay?.seconds ?? 0) + (retry.retry_delay?.nanos ?? 0) / 1e9;
      }
    }
  }
  return out;
}

function describe(e: ToolError): string {
  const meta = Object.keys(e.metadata).length ? ` ${JSON.stringify(e.metadata)}` : "";
  return `${grpc.status[e.code]} (${e.reason ?? "no ErrorInfo"})${meta}: ${e.message}`;
}

/** Seconds to wait before retrying `e`, or null when it must not be retried. */
function retryDelay(e: ToolError, attempt: number): number | null {
  const backoff = Math.min(MAX_DELAY, 0.2 * 2 ** attempt);
  if (e.code === grpc.status.UNAVAILABLE) {
    // toolgate's UNAVAILABLE means nothing reached the tool (or the tool is
    // idempotent), and always carries RetryInfo.
    if (e.retryDelay !== null) return Math.min(MAX_DELAY, e.retryDelay);
    if (e.reason === null) return backoff; // from the client library: the gateway could not be reached
    return null; // not toolgate's rule: do not guess
  }
  if (e.code === grpc.status.RESOURCE_EXHAUSTED && e.reason !== null && SHED_REASONS.has(e.reason)) {
    return Math.min(MAX_DELAY, e.retryDelay ?? backoff);
  }
  // Never UNKNOWN: the call may have reached the tool, which may have acted.
  // Never FAILED_PRECONDITION (pins are re-listed by the caller; a rejected
  // upstream credential needs an operator), nor anything else.
  return null;
}

const sleep = (seconds: number) => new Promise((resolve) => setTimeout(resolve, seconds * 1000));

/** Runs `rpc()`, retrying retryable errors at most `retries` times; rejects with RpcFailed. */
async function withRetries<T>(what: string, rpc: () => Promise<T>, retries: number): Promise<T> {
  for (let attempt = 0; ; ) {
    let error: ToolError;
    try {
      return await rpc();
    } catch (err) {
      if (!isServiceError(err)) throw err;
      error = toolError(err);
    }
    const delay = retryDelay(error, attempt);
    if (delay === null || attempt >= retries) throw new RpcFailed(error, attempt);
    attempt += 1;
    const source = error.retryDelay !== null ? "RetryInfo" : "backoff";
    console.error(`${what}: ${describe(error)}; retry ${attempt}/${retries} in ${delay.toFixed(2)}s (${source})`);
    await sleep(delay);
  }
}

function isServiceError(err: unknown): err is grpc.ServiceError {
  return err instanceof Error && typeof (err as grpc.ServiceError).code === "number" && "metadata" in err;
}

function explain(e: ToolError, retried: number, addr: string): Failed {
  const r = e.reason;
  let hint: string;
  switch (e.code) {
    case grpc.status.UNAUTHENTICATED:
      hint = "check TOOLGATE_TOKEN (sent as `authorization: Bearer <token>`)";
      break;
    case grpc.status.NOT_FOUND:
      hint =
        r === "TOOL_NOT_FOUND"
          ? "the tool is not in this tenant's catalog: list the tools again"
          : "the server reports a missing resource";
      break;
    case grpc.status.INVALID_ARGUMENT:
      hint = "fix the arguments (the message is meant for the model)";
      break;
    case grpc.status.FAILED_PRECONDITION:
      hint =
        r !== null && PIN_REASONS.has(r)
          ? "the plan is still outdated after listing again"
          : r === "UPSTREAM_AUTH_REJECTED"
            ? "the server refused the gateway's credentials: alert an operator (retrying cannot help)"
            : "the server needs something the gateway cannot relay";
      break;
    case grpc.status.RESOURCE_EXHAUSTED:
      hint =
        r !== null && SHED_REASONS.has(r)
          ? "still shed after retrying; back off"
          : "a size limit was hit; send or ask for less";
      break;
    case grpc.status.UNAVAILABLE:
      hint =
        r === null
          ? `cannot reach the gateway at ${addr}`
          : r === "DRAINING"
            ? "the gateway is shutting down; retry on another replica"
            : "still unavailable after retrying (nothing reached the tool)";
      break;
    case grpc.status.UNKNOWN:
      hint =
        r === "UPSTREAM_CONNECTION_LOST" || r === "UPSTREAM_HTTP_ERROR" || r === "SHUTTING_DOWN"
          ? "the tool may have acted; not retried: check its effect before running it again"
          : "not retried";
      break;
    case grpc.status.DEADLINE_EXCEEDED:
      hint = "the tool may have partly run; retry only with a longer --timeout";
      break;
    default:
      hint = "not retried";
  }
  const tries = retried ? ` after ${retried} retr${retried === 1 ? "y" : "ies"}` : "";
  return new Failed(`error${tries}: ${describe(e)}\nhint: ${hint}`, EXIT_CODES[e.code] ?? EXIT_OTHER);
}

// ---- output ----------------------------------------------------------------

function hints(tool: Tool): string {
  const a = tool.annotations;
  if (!a) return "-";
  const flags: string[] = [];
  for (const [name, short] of [
    ["read_only_hint", "ro"],
    ["destructive_hint", "destr"],
    ["idempotent_hint", "idem"],
    ["open_world_hint", "open"],
  ] as const) {
    if (a[`_${name}`] === name) flags.push(a[name] ? short : `!${short}`);
  }
  return flags.join(",") || "-";
}

function printListing(listing: ListToolsResponse): void {
  const rows: string[][] = [["NAME", "SERVER", "TOKENS", "HINTS", "DESCRIPTION"]];
  for (const t of listing.tools) {
    const desc = t.title || t.description;
    rows.push([t.name, t.server, String(t.estimated_tokens), hints(t), desc.length <= 60 ? desc : desc.slice(0, 57) + "..."]);
  }
  const widths = [0, 1, 2, 3].map((i) => Math.max(...rows.map((r) => r[i].length)));
  for (const r of rows) console.log(widths.map((w, i) => r[i].padEnd(w)).join("  ") + "  " + r[4]);
  console.log(`${listing.tools.length} tool(s), ~${listing.total_estimated_tokens} tokens, catalog ${listing.catalog_version}`);
  for (const s of listing.servers) {
    const state = s.state.replace(/^SERVER_STATE_/, "");
    const why = s.error && state !== "CONNECTED" ? ` (${s.error})` : "";
    console.log(`server ${s.name} [${s.transport}]: ${state}, ${s.tool_count} tool(s)${why}`);
  }
}

function defaultTool(listing: ListToolsResponse): string {
  for (const t of listing.tools) {
    try {
      const schema = JSON.parse(t.input_schema_json || "{}") as { required?: string[] };
      if (!schema.required?.length) return t.name;
    } catch {
      // not JSON: skip
    }
  }
  throw new Failed("no tool given and no listed tool can be called without arguments", 2);
}

function printResult(response: InvokeToolResponse): void {
  console.log(`is_error: ${response.is_error}`);
  console.log("text: " + response.text.replace(/\n/g, "\n      "));
  response.content.forEach((block, i) => {
    switch (block.kind) {
      case "text":
        console.log(`content[${i}] text: ${JSON.stringify(block.text!.text)}`);
        break;
      case "image":
      case "audio": {
        const media = block[block.kind]!;
        console.log(`content[${i}] ${block.kind}: ${media.data.length} bytes, ${media.mime_type || "no mime type"}`);
        break;
      }
      case "resource_link": {
        const link = block.resource_link!;
        const size = link._size === "size" ? `, ${link.size} bytes` : "";
        console.log(`content[${i}] resource_link: ${link.uri} name=${JSON.stringify(link.name)} ${link.mime_type}${size}`);
        break;
      }
      case "resource": {
        const res = block.resource!;
        const body =
          res.contents === "text"
            ? `text, ${res.text!.length} chars`
            : res.contents === "blob"
              ? `blob, ${res.blob!.length} bytes`
              : "no contents";
        console.log(`content[${i}] resource: ${res.uri} ${res.mime_type} (${body})`);
        break;
      }
      default:
        console.log(`content[${i}] unknown block (a newer proto?)`);
    }
  });
  if (response.structured_content_json) {
    console.log("structured_content: " + JSON.stringify(sortKeys(JSON.parse(response.structured_content_json))));
  }
}

function sortKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value && typeof value === "object") {
    return Object.fromEntries(
      Object.keys(value as object)
        .sort()
        .map((k) => [k, sortKeys((value as Record<string, unknown>)[k])]),
    );
  }
  return value;
}

// ---- main ------------------------------------------------------------------

interface Args {
  tool?: string;
  args: string;
  addr: string;
  timeout: number;
  retries: number;
  catalogVersion?: string;
  definitionHash?: string;
}

const USAGE =
  "usage: worker [--addr HOST:PORT] [--timeout S] [--retries N] [--catalog-version V] [--definition-hash H] [TOOL [ARGS]]";

function parseArgs(argv: string[]): Args {
  const out: Args = { args: "{}", addr: "127.0.0.1:50051", timeout: 30, retries: 3 };
  const positional: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new Failed(`${a} needs a value\n${USAGE}`, 2);
      return argv[++i];
    };
    const number = (v: string) => {
      const n = Number(v);
      if (!Number.isFinite(n) || n < 0) throw new Failed(`${a}: not a number: ${v}\n${USAGE}`, 2);
      return n;
    };
    if (a === "--addr") out.addr = value();
    else if (a === "--timeout") out.timeout = number(value());
    else if (a === "--retries") out.retries = Math.floor(number(value()));
    else if (a === "--catalog-version") out.catalogVersion = value();
    else if (a === "--definition-hash") out.definitionHash = value();
    else if (a === "-h" || a === "--help") throw new Failed(USAGE, 0);
    else if (a.startsWith("--")) throw new Failed(`unknown option ${a}\n${USAGE}`, 2);
    else positional.push(a);
  }
  if (positional.length > 2) throw new Failed(`too many arguments\n${USAGE}`, 2);
  out.tool = positional[0];
  if (positional[1] !== undefined) out.args = positional[1];
  return out;
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

async function run(args: Args): Promise<number> {
  const token = process.env.TOOLGATE_TOKEN;
  if (!token) console.error("worker: TOOLGATE_TOKEN is not set; calling without credentials");
  const metadata = new grpc.Metadata();
  if (token) metadata.set("authorization", `Bearer ${token}`);
  let parsed: unknown;
  try {
    parsed = JSON.parse(args.args);
  } catch (e) {
    throw new Failed(`ARGS is not JSON: ${(e as Error).message}`, 2);
  }
  if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
    console.error("worker: ARGS is not a JSON object; sending it anyway (the gateway refuses it)");
  }

  const client = loadClient(args.addr);
  try {
    const options = (): grpc.CallOptions => ({ deadline: Date.now() + args.timeout * 1000 });
    const unary = <Req, Res>(method: Unary<Req, Res>, request: Req) =>
      new Promise<Res>((resolve, reject) =>
        method.call(client, request, metadata, options(), (err, res) => (err ? reject(err) : resolve(res!))),
      );
    const listTools = async (): Promise<ListToolsResponse> => {
      try {
        return await withRetries("ListTools", () => unary(client.ListTools, {}), args.retries);
      } catch (e) {
        if (e instanceof RpcFailed) throw explain(e.error, e.attempts, args.addr);
        throw e;
      }
    };

    let listing = await listTools();
    printListing(listing);
    const name = args.tool ?? defaultTool(listing);
    const pins = (l: ListToolsResponse): [string, string] => [
      l.catalog_version,
      l.tools.find((t) => t.name === name)?.definition_hash ?? "",
    ];
    let [catalogVersion, definitionHash] = pins(listing);
    if (args.catalogVersion !== undefined) catalogVersion = args.catalogVersion;
    if (args.definitionHash !== undefined) definitionHash = args.definitionHash;
    let relisted = false;
    for (;;) {
      const request: InvokeToolRequest = {
        name,
        arguments_json: args.args,
        catalog_version: catalogVersion,
        definition_hash: definitionHash,
      };
      console.log(`\ninvoking ${name} ${args.args} (catalog ${catalogVersion || "-"}, definition ${definitionHash || "-"})`);
      let response: InvokeToolResponse;
      try {
        response = await withRetries("InvokeTool", () => unary(client.InvokeTool, request), args.retries);
      } catch (e) {
        if (!(e instanceof RpcFailed)) throw e;
        const error = e.error;
        if (error.code === grpc.status.FAILED_PRECONDITION && error.reason !== null && PIN_REASONS.has(error.reason) && !relisted) {
          // The catalog moved on since the plan: look again, re-plan, retry once.
          console.error(`InvokeTool: ${describe(error)}; listing again`);
          relisted = true;
          listing = await listTools();
          [catalogVersion, definitionHash] = pins(listing);
          if (!definitionHash) console.error(`InvokeTool: ${name} is no longer listed`);
          continue;
        }
        throw explain(error, e.attempts, args.addr);
      }
      printResult(response);
      return 0;
    }
  } finally {
    client.close();
  }
}

async function main(): Promise<number> {
  try {
    return await run(parseArgs(process.argv.slice(2)));
  } catch (e) {
    if (e instanceof Failed) {
      (e.exitCode === 0 ? console.log : console.error)(e.exitCode === 0 ? e.message : `worker: ${e.message}`);
      return e.exitCode;
    }
    throw e;
  }
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (e: unknown) => {
    console.error(`worker: unexpected failure: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}`);
    process.exitCode = 1;
  },
);
