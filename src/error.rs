//! What can go wrong with one RPC, in the gateway's own terms. The single
//! mapping to gRPC status lives in [`crate::grpc::status`].

use std::time::Duration;

use crate::upstream::UpstreamError;

/// A failed ToolGateway call.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No or unknown caller credential.
    #[error("unauthenticated: {0}")]
    Unauthenticated(&'static str),
    /// The name is not in the caller's catalog (or filtered out).
    #[error("tool `{name}` is not in this tenant's catalog")]
    ToolNotFound {
        /// The requested name.
        name: String,
    },
    /// `arguments_json` is not a JSON object.
    #[error("arguments_json for `{tool}` {reason}")]
    InvalidArguments {
        /// The exposed tool name.
        tool: String,
        /// What is wrong with them.
        reason: String,
    },
    /// The tool's server has no live session.
    #[error("server `{server}` is not connected ({reason}); tool `{tool}` is unavailable")]
    ServerUnavailable {
        /// The server.
        server: String,
        /// The exposed tool name.
        tool: String,
        /// Why the server is not connected.
        reason: String,
    },
    /// The upstream request failed.
    #[error("tool `{tool}` on server `{server}`: {error}")]
    Upstream {
        /// The server.
        server: String,
        /// The exposed tool name.
        tool: String,
        /// What went wrong upstream.
        error: UpstreamError,
    },
    /// The caller's deadline passed; the upstream request was cancelled.
    #[error("deadline exceeded after {} calling `{tool}` on server `{server}`; the upstream request was cancelled", humantime::format_duration(*.after))]
    DeadlineExceeded {
        /// The server.
        server: String,
        /// The exposed tool name.
        tool: String,
        /// How long the call ran.
        after: Duration,
    },
    /// A ListTools/WatchTools/SearchTools filter is malformed.
    #[error("invalid filter: {0}")]
    InvalidFilter(String),
    /// A call limit shed the call.
    #[error("{}", shed_message(.0, .1.as_deref()))]
    Shed(crate::limits::Shed, Option<String>),
    /// `arguments_json` is larger than `limits.max_argument_bytes`.
    #[error(
        "arguments_json for `{tool}` is {size} bytes, over limits.max_argument_bytes ({limit})"
    )]
    ArgumentsTooLarge {
        /// The exposed tool name.
        tool: String,
        /// The size sent.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The caller pinned a catalog version or definition hash and the tool
    /// changed or went away since.
    #[error("{detail}")]
    PlanOutdated {
        /// The exposed tool name.
        tool: String,
        /// What moved.
        pin: Pin,
        /// A sentence saying what changed.
        detail: String,
        /// The tenant's catalog version now.
        current_version: String,
        /// The tool's definition hash now (empty when gone).
        current_hash: String,
    },
    /// The gateway is draining for shutdown and takes no new calls; nothing
    /// was sent upstream, so another replica can take the call.
    #[error("the gateway is shutting down and takes no new calls; retry on another replica")]
    Draining,
    /// The gateway is shutting down and its grace period ran out.
    #[error("the gateway is shutting down; the call was cancelled")]
    ShuttingDown,
}

fn shed_message(shed: &crate::limits::Shed, server: Option<&str>) -> String {
    use crate::limits::Shed;
    match shed {
        Shed::Rate(wait) => format!(
            "tenant rate limit reached (limits.rate_per_second); retry in {} ms",
            wait.as_millis().max(1)
        ),
        Shed::TenantConcurrency(n) => {
            format!("tenant concurrency limit reached (limits.max_concurrent_calls = {n})")
        }
        Shed::ServerConcurrency(n) => format!(
            "server `{}` concurrency limit reached (max_concurrent_calls = {n})",
            server.unwrap_or("?")
        ),
    }
}

/// What moved under a caller's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin {
    /// The tool's definition differs from the pinned one.
    DefinitionChanged,
    /// The tool is no longer in the catalog.
    Gone,
    /// The pinned catalog version cannot be compared (too old, or unknown).
    VersionUnknown,
}
