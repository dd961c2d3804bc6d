//! toolgate: a gRPC tool gateway. It owns MCP client sessions per tenant
//! and serves each tenant's tool catalog over gRPC (`ListTools`,
//! `InvokeTool`), so agent workers in any language call tools without
//! speaking MCP. See `docs/architecture.md` for how the pieces fit.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

// The rooms, bottom to top: a module imports only modules of its own layer
// or a lower one (docs/architecture.md; tests/integration/architecture.rs
// holds the code to it).

// 0. Generated: the public protobuf messages and client (`pb`, below).

// 1. Configuration.
pub mod config;

// 2. The domain.
pub mod approvals;
pub mod audit;
pub mod callers;
pub mod catalog;
pub mod credentials;
pub mod guards;
pub mod listen;
pub mod policy;
pub mod state;
pub mod telemetry;

// 3. Upstream sessions.
pub mod upstream;

// 4. The registry of tenants.
pub mod registry;

// 5. The calls: the one pipeline every call takes, below every surface.
pub mod calls;

// 6. The surfaces.
pub mod admin;
pub mod consent;
pub mod grpc;

// 7. Wiring, then (8) the command line.
pub mod app;
pub mod cli;
#[doc(hidden)]
pub mod fuzzing;

/// Generated code for the `toolgate.v1` protobuf package: the messages
/// and the client. The server side is [`crate::grpc::server`], generated
/// apart because it answers `ListTools` with the gateway's pre-encoded
/// reply (see `build.rs`).
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("toolgate.v1");

    /// The admin API's messages and client (`toolgate.admin.v1`).
    pub mod admin {
        tonic::include_proto!("toolgate.admin.v1");
    }

    /// The guard API's messages, client and server (`toolgate.guard.v1`):
    /// toolgate calls guards with the client; tests and the benchmark
    /// serve it.
    pub mod guard {
        tonic::include_proto!("toolgate.guard.v1");

        /// The generated `GuardService` server, for guards written in
        /// Rust (the tests' and the benchmark's).
        #[allow(missing_docs)]
        pub mod server {
            include!(concat!(env!("OUT_DIR"), "/server/toolgate.guard.v1.rs"));
        }
    }

    /// The encoded file descriptor set, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("toolgate_descriptor");

    /// MCP's own gRPC transport, package `model_context_protocol`
    /// (release 0.2.0 of `mcp-grpc-transport-proto`, vendored in
    /// `proto-vendor/mcp_grpc/`): the messages, the `Mcp` client and
    /// server. toolgate serves it beside `toolgate.v1`
    /// ([`crate::grpc::mcp`]).
    pub mod mcp {
        tonic::include_proto!("model_context_protocol");

        /// The transport's descriptor set, for server reflection.
        pub const FILE_DESCRIPTOR_SET: &[u8] =
            tonic::include_file_descriptor_set!("mcp_transport_descriptor");
    }
}
