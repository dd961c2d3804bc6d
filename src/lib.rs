//! toolgate: a gRPC tool gateway. It owns MCP client sessions per tenant
//! and serves each tenant's tool catalog over gRPC (`ListTools`,
//! `InvokeTool`), so agent workers in any language call tools without
//! speaking MCP. See `docs/architecture.md` for how the pieces fit.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod app;
pub mod approvals;
pub mod audit;
pub mod auth;
pub mod callers;
pub mod catalog;
pub mod cli;
pub mod config;
#[doc(hidden)]
pub mod conformance;
pub mod consent;
pub mod credentials;
pub mod demo;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod grpc;
pub mod limits;
pub mod policy;
pub mod registry;
pub mod reload;
pub mod state;
pub mod telemetry;
pub mod upstream;

/// Generated code for the `toolgate.v1` protobuf package.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("toolgate.v1");

    /// The server side of the service: its `ListTools` and `WatchTools`
    /// answer [`crate::grpc::reply::ListToolsReply`], the same message on
    /// the wire as [`ListToolsResponse`] with its tools encoded ahead.
    pub use super::pb_server::tool_gateway_server;

    /// The encoded file descriptor set, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("toolgate_descriptor");
}

/// Generated server code for `toolgate.v1` (see `build.rs`).
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
mod pb_server {
    include!(concat!(env!("OUT_DIR"), "/server/toolgate.v1.rs"));
}
