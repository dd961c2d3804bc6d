//! The command line of `toolgate-bench`: what to measure, how long, and
//! the internal servers it runs as its own child processes.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// The options of a benchmark run.
#[derive(Debug, Parser)]
#[command(about = "Benchmarks toolgate against its baselines; see docs/performance.md")]
pub(crate) struct Args {
    #[command(subcommand)]
    pub(crate) command: Option<Cmd>,
    /// Interleaved rounds; figures are medians over rounds.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// Duration of each throughput run.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub(crate) duration: Duration,
    /// Calls of each sequential latency run.
    #[arg(long, default_value_t = 1000)]
    pub(crate) sequential: usize,
    /// Skip mcpo (it needs bench/mcpo/setup.sh).
    #[arg(long)]
    pub(crate) skip_mcpo: bool,
    /// Skip the many-tenant figures.
    #[arg(long)]
    pub(crate) skip_tenants: bool,
    /// Only the per-tool policy figures (a 20-rule policy against none).
    #[arg(long)]
    pub(crate) only_policy: bool,
    /// Only the ListTools figures (10,000 tools against the floor).
    #[arg(long)]
    pub(crate) only_listing: bool,
    /// Only the fast stdio, http and https paths through the gateway.
    #[arg(long)]
    pub(crate) only_http: bool,
    /// Only the many-tenant figures (memory), `--rounds` times.
    #[arg(long)]
    pub(crate) only_tenants: bool,
    /// Only the idle-pair figures: what a live 2026-07-28 tenant × server
    /// pair holds against a 2025-11-25 one (`--pairs-tenants` × 2 pairs).
    #[arg(long)]
    pub(crate) only_idle_pairs: bool,
    /// Tenants of the idle-pair figures (each with 2 servers).
    #[arg(long, default_value_t = 1000)]
    pub(crate) pairs_tenants: usize,
    /// Skip the Python-client figure (grpc.aio, 16 in flight).
    #[arg(long)]
    pub(crate) skip_python: bool,
    /// Only the Python-client figure.
    #[arg(long)]
    pub(crate) only_python: bool,
    /// Skip the large-scale run (10,000 tenants, 2,000 active).
    #[arg(long)]
    pub(crate) skip_scale: bool,
    /// Only the large-scale run.
    #[arg(long)]
    pub(crate) only_scale: bool,
    /// Length of the large-scale run.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub(crate) scale_duration: Duration,
    /// Skip the figure of a 20-rule policy and the audit trail together.
    #[arg(long)]
    pub(crate) skip_policy_audit: bool,
    /// Only the figure of a 20-rule policy and the audit trail together.
    #[arg(long)]
    pub(crate) only_policy_audit: bool,
    /// Skip the figure of a tool call over MCP's gRPC transport against
    /// InvokeTool.
    #[arg(long)]
    pub(crate) skip_mcp_transport: bool,
    /// Only the figure of a tool call over MCP's gRPC transport against
    /// InvokeTool.
    #[arg(long)]
    pub(crate) only_mcp_transport: bool,
    /// Skip the figures of a call that asks one question and of a task.
    #[arg(long)]
    pub(crate) skip_input: bool,
    /// Only the figures of a call that asks one question and of a task.
    #[arg(long)]
    pub(crate) only_input: bool,
    /// Skip the figures of ReadResource (1 MiB text and blob) and
    /// ListPrompts (1,000 prompts).
    #[arg(long)]
    pub(crate) skip_offerings: bool,
    /// Only the figures of ReadResource and ListPrompts.
    #[arg(long)]
    pub(crate) only_offerings: bool,
    /// Only the figures of tenants at scale: 100,000 tenants in PostgreSQL,
    /// two replicas following writes of the admin API, `tenants_dir`.
    #[arg(long)]
    pub(crate) only_store: bool,
    /// Only TLS on the gRPC port against plaintext: InvokeTool p50, calls/s
    /// and gateway CPU per call on a reused connection, and the cost of a
    /// new connection's handshake.
    #[arg(long)]
    pub(crate) only_tls: bool,
    /// Only the floor of a call completed: the gateway's CPU per call
    /// against a bare tonic echo's plus a bare MCP client's (in a process
    /// of its own), over the fast stdio and HTTP servers.
    #[arg(long)]
    pub(crate) only_floor: bool,
    /// Only the steps of the call pipeline (call approvals, idempotency
    /// keys, the result cache, the circuit breaker) against the plain call:
    /// configured but not triggered, all together, and triggered (gateway
    /// CPU per call and p50; one gateway per configuration, PostgreSQL for
    /// the keys' rows on it).
    #[arg(long)]
    pub(crate) only_steps: bool,
    /// Skip the figures of one guard against none.
    #[arg(long)]
    pub(crate) skip_guards: bool,
    /// Only one guard against none: InvokeTool p50 and p99, calls/s and
    /// gateway CPU per call, with an in-process guard answering `allow`,
    /// and the guard's count of checks.
    #[arg(long)]
    pub(crate) only_guards: bool,
}

/// The internal servers the benchmark starts as child processes (each a
/// `*-server` subcommand).
#[derive(Debug, Subcommand)]
#[allow(clippy::enum_variant_names)]
pub(crate) enum Cmd {
    /// (internal) the fast MCP server: stdio, or HTTP with --http PORT.
    McpServer {
        #[arg(long)]
        http: Option<u16>,
        #[arg(long, default_value_t = 0)]
        tools: usize,
        /// With --http: serve HTTPS with this directory's certificates.
        #[arg(long)]
        tls: Option<PathBuf>,
    },
    /// (internal) the bare tonic floor server.
    /// (internal) the asking server (one question, one task): stdio, or
    /// HTTP with --http PORT.
    AskServer {
        #[arg(long)]
        http: Option<u16>,
    },
    /// (internal) the resources-and-prompts server (stdio).
    OfferingsServer,
    /// (internal) a bare rmcp client of the fast server in a process of
    /// its own: `tools/call` of `echo` at --in-flight for --duration, then
    /// one JSON line with its own CPU per call (the client half of a
    /// call's floor). Stdio (it starts the server), or --url.
    DirectClient {
        /// A Streamable HTTP server's URL (absent: stdio).
        #[arg(long)]
        url: Option<String>,
        #[arg(long, default_value_t = 16)]
        in_flight: usize,
        #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
        duration: Duration,
        /// Over stdio, which client (`lean_client`): rmcp's (the floor's),
        /// or an experiment of issue 38.
        #[arg(long, value_enum, default_value_t = crate::lean_client::Client::Rmcp)]
        client: crate::lean_client::Client,
    },
    /// (internal) the bare tonic floor server.
    EchoServer {
        port: u16,
        /// An encoded ListToolsResponse to answer ListTools with.
        #[arg(long)]
        list_file: Option<PathBuf>,
    },
}
