#!/usr/bin/env node
// Reference conformance client for the client scenarios of
// @modelcontextprotocol/conformance (the two versions pinned in package.json).
//
// It exists to validate conformance/run.sh and to document, in runnable form,
// what `toolgate conformance-client URL` must do for every non-auth scenario.
// CI does not test it; CI tests toolgate's own subcommand.
//
// Contract with the runner (both pinned versions):
//   argv:  the scenario server URL is the LAST argument
//   env:   MCP_CONFORMANCE_SCENARIO          scenario name
//          MCP_CONFORMANCE_CONTEXT           JSON {"name": <scenario>, ...extra}; only
//                                            http-custom-headers (and auth/*) set it
//          MCP_CONFORMANCE_PROTOCOL_VERSION  0.2.x only: "2025-11-25" (stateful:
//                                            initialize handshake, Streamable HTTP
//                                            sessions) or "2026-07-28" (stateless:
//                                            no initialize, per-request _meta +
//                                            MCP-Protocol-Version header). Unset in
//                                            0.1.x, which is always stateful.
//   exit:  0 when the flow completed; non-zero fails the scenario (except the
//          few scenarios marked allowClientError). stdout is not inspected.
//
// Usage: MCP_CONFORMANCE_SCENARIO=tools_call node reference-client.mjs http://localhost:1234/mcp

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
  CallToolResultSchema,
  CreateMessageRequestSchema,
  ElicitRequestSchema,
  ListRootsRequestSchema
} from '@modelcontextprotocol/sdk/types.js';

const STATEFUL_VERSIONS = ['2024-11-05', '2025-03-26', '2025-06-18', '2025-11-25'];
const STATELESS_VERSIONS = ['2026-07-28'];
const CLIENT_INFO = { name: 'toolgate-reference-client', version: '1.0.0' };
const CLIENT_CAPABILITIES = { roots: {}, sampling: {}, elicitation: {} };

const scenario = process.env.MCP_CONFORMANCE_SCENARIO;
const requestedVersion = process.env.MCP_CONFORMANCE_PROTOCOL_VERSION;
const context = JSON.parse(process.env.MCP_CONFORMANCE_CONTEXT || '{}');
const serverUrl = process.argv[process.argv.length - 1];
const stateless =
  requestedVersion !== undefined && !STATEFUL_VERSIONS.includes(requestedVersion);

const log = (...a) => console.error('[reference-client]', ...a);

// ---------------------------------------------------------------------------
// Answers to server-initiated requests (stateful: real JSON-RPC requests from
// the server; stateless: `inputRequests` of an input_required result).
// ---------------------------------------------------------------------------

/** Accept an elicitation, filling every property with its schema default. */
function answerElicitation(params) {
  const content = {};
  const props = params?.requestedSchema?.properties ?? {};
  for (const [key, schema] of Object.entries(props)) {
    if (schema.default !== undefined) content[key] = schema.default;
    else if (schema.type === 'boolean') content[key] = true;
    else if (Array.isArray(schema.enum) && schema.enum.length > 0) content[key] = schema.enum[0];
    else if (schema.type === 'number' || schema.type === 'integer') content[key] = 0;
    else if (schema.type === 'string') content[key] = 'conformance';
  }
  return { action: 'accept', content };
}

function answerSampling(_params) {
  return {
    role: 'assistant',
    content: { type: 'text', text: 'conformance sampling reply' },
    model: 'toolgate-reference',
    stopReason: 'endTurn'
  };
}

function answerRoots() {
  return { roots: [] };
}

function answerInputRequest(req) {
  switch (req?.method) {
    case 'elicitation/create':
      return answerElicitation(req.params);
    case 'sampling/createMessage':
      return answerSampling(req.params);
    case 'roots/list':
      return answerRoots();
    default:
      throw new Error(`unsupported input request method: ${req?.method}`);
  }
}

// ---------------------------------------------------------------------------
// x-mcp-header (SEP-2243): validation of tool definitions and header values.
// ---------------------------------------------------------------------------

const TCHAR = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/; // RFC 9110 token
// 0.2.0-alpha.12: `number` is NOT allowed (invalid_number_header must be dropped).
const PRIMITIVE = new Set(['string', 'integer', 'boolean']);

/** Map of argument name -> header suffix, or null when the tool is invalid. */
function headerAnnotations(tool) {
  const out = {};
  const seen = new Set();
  const props = tool?.inputSchema?.properties ?? {};
  for (const [arg, schema] of Object.entries(props)) {
    if (!schema || typeof schema !== 'object' || !('x-mcp-header' in schema)) continue;
    const name = schema['x-mcp-header'];
    if (typeof name !== 'string' || name.length === 0 || !TCHAR.test(name)) return null;
    const types = Array.isArray(schema.type) ? schema.type : [schema.type];
    if (!types.every((t) => PRIMITIVE.has(t))) return null;
    const lower = name.toLowerCase();
    if (seen.has(lower)) return null;
    seen.add(lower);
    out[arg] = name;
  }
  return out;
}

/** Header value encoding: plain when safe visible ASCII, else =?base64?...?= */
function encodeHeaderValue(value) {
  const s = typeof value === 'string' ? value : typeof value === 'boolean' ? String(value) : String(value);
  const safe = /^[\x20-\x7e]*$/.test(s) && s === s.trim();
  return safe ? s : `=?base64?${Buffer.from(s, 'utf8').toString('base64')}?=`;
}

// ---------------------------------------------------------------------------
// Stateless (2026-07-28) requester: plain HTTP POST per request.
// ---------------------------------------------------------------------------

class StatelessSession {
  constructor(url, version) {
    this.url = url;
    this.version = version;
    this.nextId = 1;
    this.tools = new Map(); // name -> annotations (valid tools only)
  }

  headersFor(method, params) {
    const h = {
      'Content-Type': 'application/json',
      Accept: 'application/json, text/event-stream',
      'MCP-Protocol-Version': this.version,
      'Mcp-Method': method
    };
    if (method === 'tools/call' || method === 'prompts/get') h['Mcp-Name'] = params.name;
    if (method === 'resources/read') h['Mcp-Name'] = params.uri;
    if (method === 'tools/call') {
      const ann = this.tools.get(params.name) ?? {};
      for (const [arg, header] of Object.entries(ann)) {
        const v = params.arguments?.[arg];
        if (v === undefined || v === null) continue;
        h[`Mcp-Param-${header}`] = encodeHeaderValue(v);
      }
    }
    return h;
  }

  async post(method, params) {
    const id = this.nextId++;
    const body = {
      jsonrpc: '2.0',
      id,
      method,
      params: {
        ...params,
        _meta: {
          ...(params._meta ?? {}),
          'io.modelcontextprotocol/protocolVersion': this.version,
          'io.modelcontextprotocol/clientInfo': CLIENT_INFO,
          'io.modelcontextprotocol/clientCapabilities': CLIENT_CAPABILITIES
        }
      }
    };
    const res = await fetch(this.url, {
      method: 'POST',
      headers: this.headersFor(method, params),
      body: JSON.stringify(body)
    });
    const type = res.headers.get('content-type') ?? '';
    let msg;
    if (type.includes('text/event-stream')) {
      const text = await res.text();
      for (const block of text.split(/\r?\n\r?\n/)) {
        const data = block
          .split(/\r?\n/)
          .filter((l) => l.startsWith('data:'))
          .map((l) => l.slice(5).trimStart())
          .join('\n');
        if (!data) continue;
        const m = JSON.parse(data);
        if (m.id === id) msg = m;
      }
    } else if (res.status === 202 || res.status === 204) {
      msg = { id, result: {} };
    } else {
      msg = await res.json();
    }
    if (!msg) throw new Error(`${method}: no response (HTTP ${res.status})`);
    return msg;
  }

  /** One request with version negotiation (-32022 -> retry once with a mutual version). */
  async request(method, params = {}) {
    let msg = await this.post(method, params);
    if (msg.error?.code === -32022) {
      const supported = msg.error.data?.supported ?? [];
      const mutual = STATELESS_VERSIONS.concat(this.version).find((v) => supported.includes(v));
      if (!mutual) throw new Error(`no mutually supported protocol version in ${supported}`);
      log(`version ${this.version} rejected; retrying with ${mutual}`);
      this.version = mutual;
      msg = await this.post(method, params);
    }
    if (msg.error) throw new Error(`${method} failed: ${msg.error.code} ${msg.error.message}`);
    return msg.result;
  }

  /** Request with the multi-round (input_required) loop of SEP-2322. */
  async requestMrtr(method, params = {}, maxRounds = 8) {
    let result = await this.request(method, params);
    for (let round = 0; result?.resultType === 'input_required'; round++) {
      if (round >= maxRounds) throw new Error(`${method}: too many input rounds`);
      const inputResponses = {};
      for (const [key, req] of Object.entries(result.inputRequests ?? {})) {
        inputResponses[key] = answerInputRequest(req);
      }
      const retry = { ...params, inputResponses };
      if (result.requestState !== undefined) retry.requestState = result.requestState;
      result = await this.request(method, retry); // fresh JSON-RPC id each time
    }
    return result; // absent resultType means "complete"
  }

  async discover() {
    return this.request('server/discover');
  }

  async listTools() {
    const result = await this.request('tools/list');
    const usable = [];
    for (const tool of result.tools ?? []) {
      const ann = headerAnnotations(tool);
      if (ann === null) {
        log(`excluding tool ${tool.name}: invalid x-mcp-header annotation`);
        continue;
      }
      this.tools.set(tool.name, ann);
      usable.push(tool);
    }
    return usable;
  }

  callTool(name, args) {
    return this.requestMrtr('tools/call', { name, arguments: args });
  }
  close() {}
}

// ---------------------------------------------------------------------------
// Stateful (<= 2025-11-25) session: the official SDK client.
// ---------------------------------------------------------------------------

class StatefulSession {
  async connect(url) {
    this.client = new Client(CLIENT_INFO, { capabilities: CLIENT_CAPABILITIES });
    this.client.setRequestHandler(ElicitRequestSchema, (r) => answerElicitation(r.params));
    this.client.setRequestHandler(CreateMessageRequestSchema, (r) => answerSampling(r.params));
    this.client.setRequestHandler(ListRootsRequestSchema, () => answerRoots());
    this.transport = new StreamableHTTPClientTransport(new URL(url));
    await this.client.connect(this.transport);
    this.tools = new Map();
    return this;
  }
  async listTools() {
    const { tools } = await this.client.listTools();
    const usable = [];
    for (const tool of tools) {
      const ann = headerAnnotations(tool);
      if (ann === null) continue;
      this.tools.set(tool.name, ann);
      usable.push(tool);
    }
    return usable;
  }
  callTool(name, args) {
    return this.client.request(
      { method: 'tools/call', params: { name, arguments: args } },
      CallToolResultSchema,
      { timeout: 20000 }
    );
  }
  async close() {
    await this.transport.close();
  }
}

async function open(url) {
  return stateless ? new StatelessSession(url, requestedVersion) : new StatefulSession().connect(url);
}

/** Arguments for a tool nobody told us about: one value per required property. */
function syntheticArgs(tool) {
  const args = {};
  const props = tool.inputSchema?.properties ?? {};
  for (const key of tool.inputSchema?.required ?? []) {
    const t = props[key]?.type;
    args[key] = t === 'number' || t === 'integer' ? 1 : t === 'boolean' ? true : 'us-west1';
  }
  return args;
}

// ---------------------------------------------------------------------------
// Scenario flows.
// ---------------------------------------------------------------------------

const flows = {
  // Stateful only: initialize (version, clientInfo), initialized, tools/list.
  async initialize(url) {
    const s = await open(url);
    await s.listTools();
    await s.close();
  },

  // tools/list then tools/call add_numbers with numeric a and b.
  async tools_call(url) {
    const s = await open(url);
    const tools = await s.listTools();
    const tool = tools.find((t) => t.name === 'add_numbers') ?? tools[0];
    const r = await s.callTool(tool.name, { a: 5, b: 3 });
    log('tools/call result:', JSON.stringify(r));
    await s.close();
  },

  // Server sends elicitation/create during tools/call; accept with defaults.
  async 'elicitation-sep1034-client-defaults'(url) {
    const s = await open(url);
    await s.listTools();
    await s.callTool('test_client_elicitation_defaults', {});
    await s.close();
  },

  // tools/call test_reconnection: the POST SSE stream closes after a priming
  // event (id + retry: 500); the client must GET with Last-Event-ID after
  // >= retry ms and receive the result on that stream.
  async 'sse-retry'(url) {
    const s = await open(url);
    await s.listTools();
    const r = await s.callTool('test_reconnection', {});
    log('tools/call result:', JSON.stringify(r));
    await s.close();
  },

  // Stateless: every POST carries MCP-Protocol-Version == _meta protocolVersion,
  // _meta clientInfo + clientCapabilities (roots/sampling/elicitation objects);
  // first request is answered 400/-32022 and must be retried.
  async 'request-metadata'(url) {
    const s = await open(url);
    if (s instanceof StatelessSession) await s.discover();
    await s.listTools();
    await s.close();
  },

  // Stateless MRTR: call every tool; answer input_required rounds.
  async 'sep-2322-client-request-state'(url) {
    const s = await open(url);
    for (const tool of await s.listTools()) await s.callTool(tool.name, {});
    await s.close();
  },

  // Mcp-Method on every POST, Mcp-Name on tools/call, resources/read, prompts/get.
  async 'http-standard-headers'(url) {
    const s = await open(url);
    if (s instanceof StatelessSession) await s.discover();
    for (const tool of await s.listTools()) await s.callTool(tool.name, syntheticArgs(tool));
    if (s instanceof StatelessSession) {
      const { resources = [] } = await s.request('resources/list');
      for (const r of resources) await s.requestMrtr('resources/read', { uri: r.uri });
      const { prompts = [] } = await s.request('prompts/list');
      for (const p of prompts) await s.requestMrtr('prompts/get', { name: p.name, arguments: {} });
    }
    await s.close();
  },

  // Call the tools named in MCP_CONFORMANCE_CONTEXT.toolCalls with exactly
  // those arguments, mirroring x-mcp-header params into Mcp-Param-* headers.
  async 'http-custom-headers'(url) {
    const s = await open(url);
    await s.listTools();
    for (const call of context.toolCalls ?? []) await s.callTool(call.name, call.arguments);
    await s.close();
  },

  // Drop tools with invalid x-mcp-header annotations, keep and call the rest.
  async 'http-invalid-tool-headers'(url) {
    const s = await open(url);
    for (const tool of await s.listTools()) await s.callTool(tool.name, syntheticArgs(tool));
    await s.close();
  },

  // tools/list only; never fetch a network $ref found in an inputSchema.
  async 'json-schema-ref-no-deref'(url) {
    const s = await open(url);
    await s.listTools();
    await s.close();
  },

  // Echo the focal tool's inputSchema verbatim to json_schema_echo.
  async 'json-schema-2020-12-preservation'(url) {
    const s = await open(url);
    const tools = await s.listTools();
    const focal = tools.find((t) => t.name === 'json_schema_2020_12_tool');
    if (!focal) throw new Error('json_schema_2020_12_tool not advertised');
    await s.callTool('json_schema_echo', { schema: focal.inputSchema });
    await s.close();
  }
};

// SEP-2640 skills extension: not supported, so connect and list tools but never
// call skills/list; the scenarios report SKIPPED (a pass) for such a client.
for (const name of [
  'sep-2640-client-no-prefetch',
  'sep-2640-client-verify-digest',
  'sep-2640-client-verify-size',
  'sep-2640-client-verify-frontmatter'
]) {
  flows[name] = flows.initialize;
}

async function main() {
  if (!scenario || !serverUrl || !/^https?:/.test(serverUrl)) {
    console.error('usage: MCP_CONFORMANCE_SCENARIO=<name> reference-client.mjs <server-url>');
    process.exit(2);
  }
  let flow = flows[scenario];
  if (!flow && scenario.startsWith('auth/')) {
    // No OAuth (like toolgate today): connect and list tools without
    // credentials; the 401 makes this exit non-zero. These runs are the
    // expected-failures baseline.
    flow = flows.initialize;
  }
  if (!flow) {
    console.error(`unsupported scenario: ${scenario}`);
    process.exit(1);
  }
  log(`scenario=${scenario} version=${requestedVersion ?? '(unset)'} stateless=${stateless}`);
  await flow(serverUrl);
  process.exit(0);
}

main().catch((e) => {
  console.error('[reference-client] error:', e?.stack ?? e);
  process.exit(1);
});
