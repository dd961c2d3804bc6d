//! Prometheus metrics, served in the OpenMetrics text format on a separate
//! HTTP listener (`metrics: { listen: ADDR }`, path `/metrics`).
//!
//! | metric | type | labels |
//! | --- | --- | --- |
//! | `toolgate_calls_total` | counter | tenant, server, tool, outcome |
//! | `toolgate_call_duration_seconds` | histogram | tenant, server |
//! | `toolgate_upstream_request_duration_seconds` | histogram | tenant, server, method |
//! | `toolgate_calls_in_flight` | gauge | tenant |
//! | `toolgate_upstream_session_up` | gauge | tenant, server |
//! | `toolgate_upstream_connects_total` | counter | tenant, server, result |
//! | `toolgate_upstream_reconnects_total` | counter | tenant, server |
//! | `toolgate_upstream_session_lost_total` | counter | tenant, server |
//! | `toolgate_config_reloads_total` | counter | result |
//! | `toolgate_oauth_events_total` | counter | tenant, server, event |
//! | `toolgate_oauth_callbacks_unmatched_total` | counter | outcome |
//! | `toolgate_tasks_total` | counter | tenant, server, tool, event |
//! | `toolgate_tools_withheld` | gauge | tenant, server |
//! | `toolgate_audit_failures_total` | counter | reason |
//! | `toolgate_tenants` | gauge | source |
//! | `toolgate_store_tenants_loaded` | gauge | |
//! | `toolgate_store_tenants_evicted_total` | counter | |
//! | `toolgate_store_tenant_loads_total` | counter | outcome |
//! | `toolgate_tenant_change_lag_seconds` | histogram | |
//! | `toolgate_tenants_dir_files` | gauge | state |
//! | `toolgate_admin_requests_total` | counter | rpc, code |
//! | `toolgate_tls_certificate_expiry_timestamp_seconds` | gauge | listener |
//! | `toolgate_tls_reloads_total` | counter | listener, outcome |
//! | `toolgate_tls_handshake_failures_total` | counter | listener |
//! | `toolgate_guard_checks_total` | counter | guard, phase, verdict |
//! | `toolgate_guard_check_seconds` | histogram | guard |
//! | `toolgate_call_approvals_total` | counter | tenant, event |
//! | `toolgate_call_approvals_pending` | gauge | tenant |
//! | `toolgate_call_approval_decision_seconds` | histogram | tenant |
//! | `toolgate_idempotency_keys_total` | counter | tenant, outcome |
//! | `toolgate_circuit_open` | gauge | tenant, server |
//! | `toolgate_circuit_opened_total` | counter | tenant, server |
//! | `toolgate_circuit_probes_total` | counter | tenant, server, result |

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

mod breaker;
mod cache;
mod call_approvals;
mod calls;
mod guards;
mod idempotency;
mod tenants;
mod tls;

pub use breaker::CircuitMetrics;
pub use cache::CacheMetrics;
pub use call_approvals::CallApprovalMetrics;
pub use calls::{InFlight, TenantCalls, ToolCalls};
pub use guards::GuardMetrics;
pub use idempotency::IdempotencyMetrics;
pub use tenants::{LoadOutcome, TenantMetrics};
pub use tls::TlsMetrics;

/// Labels of a finished call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    tenant: String,
    server: String,
    tool: String,
    outcome: String,
}

/// Tenant and server.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabels {
    tenant: String,
    server: String,
}

/// An upstream request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    tenant: String,
    server: String,
    method: String,
}

/// A connect attempt.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectLabels {
    tenant: String,
    server: String,
    result: String,
}

/// An OAuth event of a server.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OAuthLabels {
    tenant: String,
    server: String,
    event: String,
}

/// An event of a task (SEP-2663): never its id.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabels {
    tenant: String,
    server: String,
    tool: String,
    event: String,
}

/// Why an audit record was not written.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AuditLabels {
    reason: String,
}

/// A question of a round, or an answer to one.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InputRoundLabels {
    tenant: String,
    server: String,
    tool: String,
    kind: String,
    outcome: String,
}

/// A request of a resource, prompt or completion RPC.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    tenant: String,
    server: String,
    rpc: String,
    outcome: String,
}

/// A tenant.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabels {
    tenant: String,
}

fn latency_histogram() -> Histogram {
    // 0.5 ms … ~65 s.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.0005, 2.0, 18,
    ))
}

/// Every metric of the gateway.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// The families of the call path, and their series resolved per
    /// tenant and tool.
    call_families: calls::CallFamilies,
    call_series: calls::CallSeries,
    session_up: Family<ServerLabels, Gauge>,
    connects: Family<ConnectLabels, Counter>,
    reconnects: Family<ServerLabels, Counter>,
    sessions_lost: Family<ServerLabels, Counter>,
    reloads: Family<ReloadLabels, Counter>,
    oauth: Family<OAuthLabels, Counter>,
    tasks: Family<TaskLabels, Counter>,
    callbacks_unmatched: Family<OutcomeLabels, Counter>,
    tools_withheld: Family<ServerLabels, Gauge>,
    audit_failures: Family<AuditLabels, Counter>,
    input_rounds: Family<InputRoundLabels, Counter>,
    requests: Family<RequestLabels, Counter>,
    input_refused: Family<RefusedLabels, Counter>,
    tenants: TenantMetrics,
    tls: TlsMetrics,
    tenants_dir_files: Family<FileStateLabels, Gauge>,
    admin_requests: Family<AdminLabels, Counter>,
    guards: GuardMetrics,
    call_approvals: CallApprovalMetrics,
    idempotency: IdempotencyMetrics,
    circuits: CircuitMetrics,
    cache: CacheMetrics,
}

/// The state of a `tenants_dir` file.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FileStateLabels {
    state: String,
}

/// A request of the admin API.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdminLabels {
    rpc: String,
    code: String,
}

/// A server's question refused upstream.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    tenant: String,
    server: String,
    reason: String,
}

/// An outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

/// A reload's result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh set of metrics, registered.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let calls = Family::<CallLabels, Counter>::default();
        let call_duration =
            Family::<ServerLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        let upstream_duration =
            Family::<UpstreamLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        let in_flight = Family::<TenantLabels, Gauge>::default();
        let session_up = Family::<ServerLabels, Gauge>::default();
        let connects = Family::<ConnectLabels, Counter>::default();
        let sessions_lost = Family::<ServerLabels, Counter>::default();
        let reconnects = Family::<ServerLabels, Counter>::default();
        let reloads = Family::<ReloadLabels, Counter>::default();
        let oauth = Family::<OAuthLabels, Counter>::default();
        let tasks = Family::<TaskLabels, Counter>::default();
        registry.register(
            "toolgate_tasks",
            "Events of tasks (SEP-2663) by tenant, server, tool and event: created (a call \
             with accepts_task became a task), updated, completed, failed, cancelled",
            tasks.clone(),
        );
        let tools_withheld = Family::<ServerLabels, Gauge>::default();
        registry.register(
            "toolgate_tools_withheld",
            "Tools of a `definitions: approved` server withheld because their definitions are \
             not approved (new, or changed since approved)",
            tools_withheld.clone(),
        );
        let audit_failures = Family::<AuditLabels, Counter>::default();
        registry.register(
            "toolgate_audit_failures",
            "Audit records not written, by reason (write: the sink could not be opened or \
             written; timeout: not written within 5 s; overflow: the writer's queue was full)",
            audit_failures.clone(),
        );
        registry.register(
            "toolgate_oauth_events",
            "OAuth events by tenant, server and event: token_refreshed, token_issued, \
             consent_completed, consent_failed, and failures by reason (authorization_required, \
             store_unavailable, token_failed)",
            oauth.clone(),
        );
        let input_rounds = Family::<InputRoundLabels, Counter>::default();
        registry.register(
            "toolgate_input_rounds",
            "Questions of servers handed to workers and their answers (2026-07-28 rounds of \
             InvokeTool and InvokeToolStream), by tenant, server, tool, kind (form, url, sampling, \
             roots) and outcome (asked, not_accepted, rounds_exceeded; accept, decline, cancel)",
            input_rounds.clone(),
        );
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "toolgate_requests",
            "ReadResource, GetPrompt and Complete requests by tenant, server (a configured \
             server's name; empty when the request named none the tenant has), rpc and outcome \
             (ok, or the error reason)",
            requests.clone(),
        );
        let callbacks_unmatched = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "toolgate_oauth_callbacks_unmatched",
            "OAuth callbacks whose state names no pending flow (expired, forged or malformed), \
             by outcome (recorded: written to the audit trail; limited: over the per-peer or \
             global rate, answered 429 and not recorded)",
            callbacks_unmatched.clone(),
        );
        registry.register(
            "toolgate_config_reloads",
            "Configuration reloads by result (applied, invalid)",
            reloads.clone(),
        );
        registry.register(
            "toolgate_upstream_reconnects",
            "Reconnect attempts after a failed connect or a lost session",
            reconnects.clone(),
        );
        registry.register(
            "toolgate_calls",
            "InvokeTool calls by tenant, server, tool and outcome (ok, tool_error, or the error reason)",
            calls.clone(),
        );
        registry.register(
            "toolgate_call_duration_seconds",
            "InvokeTool latency as seen by the gateway",
            call_duration.clone(),
        );
        registry.register(
            "toolgate_upstream_request_duration_seconds",
            "Latency of MCP requests to upstream servers",
            upstream_duration.clone(),
        );
        registry.register(
            "toolgate_calls_in_flight",
            "InvokeTool calls currently running",
            in_flight.clone(),
        );
        registry.register(
            "toolgate_upstream_session_up",
            "1 while the upstream session is connected, else 0",
            session_up.clone(),
        );
        registry.register(
            "toolgate_upstream_connects",
            "Upstream connect attempts by result (ok, failed)",
            connects.clone(),
        );
        registry.register(
            "toolgate_upstream_session_lost",
            "Upstream sessions that ended on their own (child exit, connection lost)",
            sessions_lost.clone(),
        );
        let input_refused = Family::<RefusedLabels, Counter>::default();
        registry.register(
            "toolgate_input_refused",
            "Questions of servers (elicitation, sampling) answered with an error instead of \
             reaching a worker, by reason (untied: no single call could be named; not_opted_in: \
             the call's worker does not answer that kind; needs_interactive: it does, but only \
             over InvokeToolInteractive; too_large: over 64 KiB; rounds_exceeded: more questions for \
             one call than input.max_rounds; unanswered: the worker gave no answer in time or \
             went away)",
            input_refused.clone(),
        );
        let tenants = TenantMetrics::register(&mut registry);
        let tls = TlsMetrics::register(&mut registry);
        let guards = GuardMetrics::register(&mut registry);
        let call_approvals = CallApprovalMetrics::register(&mut registry);
        let idempotency = IdempotencyMetrics::register(&mut registry);
        let circuits = CircuitMetrics::register(&mut registry);
        let cache = CacheMetrics::register(&mut registry);
        let tenants_dir_files = Family::<FileStateLabels, Gauge>::default();
        registry.register(
            "toolgate_tenants_dir_files",
            "Files of tenants_dir by state: ok (its latest version serves), invalid (refused: \
             it does not validate, or its name or a token is taken; its previous version may \
             still serve)",
            tenants_dir_files.clone(),
        );
        let admin_requests = Family::<AdminLabels, Counter>::default();
        registry.register(
            "toolgate_admin_requests",
            "Requests of the admin API (toolgate.admin.v1.Admin) by rpc and gRPC status code \
             name (OK, UNAUTHENTICATED, INVALID_ARGUMENT, ABORTED, ...)",
            admin_requests.clone(),
        );
        Metrics {
            guards,
            cache,
            call_approvals,
            idempotency,
            circuits,
            tenants,
            tls,
            registry,
            input_refused,
            tenants_dir_files,
            call_families: calls::CallFamilies {
                calls,
                call_duration,
                upstream_duration,
                in_flight,
            },
            call_series: calls::CallSeries::default(),
            session_up,
            connects,
            reconnects,
            sessions_lost,
            reloads,
            oauth,
            tasks,
            callbacks_unmatched,
            audit_failures,
            tools_withheld,
            input_rounds,
            requests,
            admin_requests,
        }
    }

    /// The guards' checks (`guards:`).
    pub fn guards(&self) -> &GuardMetrics {
        &self.guards
    }

    /// The result cache (`calls::cache`).
    pub fn cache(&self) -> &CacheMetrics {
        &self.cache
    }

    /// Call approvals (tool calls held for a person's decision).
    pub fn call_approvals(&self) -> &CallApprovalMetrics {
        &self.call_approvals
    }

    /// Idempotency keys of tool calls.
    pub fn idempotency(&self) -> &IdempotencyMetrics {
        &self.idempotency
    }

    /// The calls' circuit breakers.
    pub fn circuits(&self) -> &CircuitMetrics {
        &self.circuits
    }

    /// Counts one `rpc` request of `tenant` to `server` that ended with
    /// `outcome` (`ok` or the error reason) in `toolgate_requests_total`.
    /// `server` must be a configured server's name (`None` otherwise), so
    /// that callers cannot grow the label set.
    pub fn request(&self, tenant: &str, server: Option<&str>, rpc: &str, outcome: &str) {
        self.requests
            .get_or_create(&RequestLabels {
                tenant: tenant.to_owned(),
                server: server.unwrap_or_default().to_owned(),
                rpc: rpc.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Counts a question of `kind` in a round of `tenant`'s `tool`, or an
    /// answer to one (`toolgate_input_rounds_total`). Never an id: the
    /// label set stays bounded by the configuration and the catalog.
    pub fn input_round(&self, tenant: &str, server: &str, tool: &str, kind: &str, outcome: &str) {
        self.input_rounds
            .get_or_create(&InputRoundLabels {
                tenant: tenant.to_owned(),
                server: server.to_owned(),
                tool: tool.to_owned(),
                kind: kind.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Shows `toolgate_audit_failures_total` at 0 for each reason, so
    /// that alerts see the series before the first failure.
    pub fn audit_configured(&self) {
        for reason in ["write", "timeout", "overflow"] {
            drop(self.audit_failures.get_or_create(&AuditLabels {
                reason: reason.to_owned(),
            }));
        }
    }

    /// Counts an audit record that was not written (`toolgate_audit_failures_total`).
    pub fn audit_failure(&self, reason: &str) {
        self.audit_failures
            .get_or_create(&AuditLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Sets how many tools of `tenant`'s `server` are withheld for want of
    /// approval (`toolgate_tools_withheld`).
    pub fn tools_withheld(&self, tenant: &str, server: &str, count: usize) {
        self.tools_withheld
            .get_or_create(&ServerLabels {
                tenant: tenant.to_owned(),
                server: server.to_owned(),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Counts an OAuth event of `tenant`'s `server` (never a subject: the
    /// label set stays bounded by the configuration).
    pub fn oauth_event(&self, tenant: &str, server: &str, event: &str) {
        self.oauth
            .get_or_create(&OAuthLabels {
                tenant: tenant.to_owned(),
                server: server.to_owned(),
                event: event.to_owned(),
            })
            .inc();
    }

    /// Counts an event of a task of `tenant`'s `server` and `tool`
    /// (`toolgate_tasks_total`; never a task id).
    pub fn task_event(&self, tenant: &str, server: &str, tool: &str, event: &str) {
        self.tasks
            .get_or_create(&TaskLabels {
                tenant: tenant.to_owned(),
                server: server.to_owned(),
                tool: tool.to_owned(),
                event: event.to_owned(),
            })
            .inc();
    }

    /// Counts a request of the admin API by `rpc` and status `code` name
    /// (`toolgate_admin_requests_total`).
    pub fn admin_request(&self, rpc: &str, code: &str) {
        self.admin_requests
            .get_or_create(&AdminLabels {
                rpc: rpc.to_owned(),
                code: code.to_owned(),
            })
            .inc();
    }

    /// Counts a callback that completed no pending flow, by `outcome`
    /// (`recorded` or `limited`: `toolgate_oauth_callbacks_unmatched_total`).
    pub fn callback_unmatched(&self, outcome: &str) {
        self.callbacks_unmatched
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// The call series of `tenant` (in flight, calls, latencies), resolved
    /// once: a call increments them without building labels.
    pub fn calls(&self, tenant: &str) -> Arc<TenantCalls> {
        self.call_series.tenant(&self.call_families, tenant)
    }

    /// Records a connect attempt (a reconnect when `retry`) and the
    /// session state.
    pub fn connect_result(&self, tenant: &str, server: &str, ok: bool, retry: bool) {
        let server_labels = ServerLabels {
            tenant: tenant.to_owned(),
            server: server.to_owned(),
        };
        self.connects
            .get_or_create(&ConnectLabels {
                tenant: tenant.to_owned(),
                server: server.to_owned(),
                result: if ok { "ok" } else { "failed" }.to_owned(),
            })
            .inc();
        if retry {
            self.reconnects.get_or_create(&server_labels).inc();
        }
        self.session_up
            .get_or_create(&server_labels)
            .set(i64::from(ok));
    }

    /// Sets `toolgate_tenants_dir_files`: `ok` files serve their latest
    /// version, `invalid` ones were refused.
    pub fn tenants_dir_files(&self, ok: usize, invalid: usize) {
        for (state, count) in [("ok", ok), ("invalid", invalid)] {
            self.tenants_dir_files
                .get_or_create(&FileStateLabels {
                    state: state.to_owned(),
                })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    /// Counts a configuration reload.
    pub fn config_reload(&self, applied: bool) {
        self.reloads
            .get_or_create(&ReloadLabels {
                result: if applied { "applied" } else { "invalid" }.to_owned(),
            })
            .inc();
    }

    /// Records a server's question refused upstream, by `reason`.
    pub fn input_refused(&self, tenant: &str, server: &str, reason: &str) {
        let labels = RefusedLabels {
            tenant: tenant.to_owned(),
            server: server.to_owned(),
            reason: reason.to_owned(),
        };
        self.input_refused.get_or_create(&labels).inc();
    }

    /// Records that a session ended on its own.
    pub fn session_lost(&self, tenant: &str, server: &str) {
        let labels = ServerLabels {
            tenant: tenant.to_owned(),
            server: server.to_owned(),
        };
        self.sessions_lost.get_or_create(&labels).inc();
        self.session_up.get_or_create(&labels).set(0);
    }

    /// The metrics of tenants' sources and of the state store's tenants.
    pub fn tenants(&self) -> &TenantMetrics {
        &self.tenants
    }

    /// The metrics of the listeners' TLS.
    pub fn tls(&self) -> &TlsMetrics {
        &self.tls
    }

    /// Records that a session was closed by the gateway.
    pub fn session_closed(&self, tenant: &str, server: &str) {
        self.session_up
            .get_or_create(&ServerLabels {
                tenant: tenant.to_owned(),
                server: server.to_owned(),
            })
            .set(0);
    }

    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail; a metric whose encoding fails
        // would leave the page cut short, so it is said once per scrape.
        if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::error!(%error, "metrics encoding failed: the page is incomplete");
        }
        text
    }

    /// The metrics in the Prometheus text format 0.0.4, for scrapers that
    /// do not ask for OpenMetrics.
    pub fn encode_prometheus(&self) -> String {
        openmetrics_to_prometheus(&self.encode())
    }
}

/// Rewrites OpenMetrics text as Prometheus text 0.0.4: counter families are
/// named with their `_total` suffix, and `# EOF` and `# UNIT` lines go.
fn openmetrics_to_prometheus(text: &str) -> String {
    let counters: std::collections::HashSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# TYPE ", "# HELP "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match renamed {
            Some(line) => out.push_str(&line),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Serves `GET /metrics` on `listener` (a `TcpListener`, or a
/// `crate::listen::TlsListener`) until `stop` is cancelled.
pub async fn serve<L>(listener: L, metrics: Arc<Metrics>, stop: CancellationToken)
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move |headers: http::HeaderMap| {
            let metrics = metrics.clone();
            async move {
                // OpenMetrics when the scraper asks for it (Prometheus does),
                // else the classic text format.
                let openmetrics = headers
                    .get_all(http::header::ACCEPT)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .any(|v| v.contains("application/openmetrics-text"));
                if openmetrics {
                    (
                        [(
                            http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        metrics.encode(),
                    )
                } else {
                    (
                        [(
                            http::header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        metrics.encode_prometheus(),
                    )
                }
            }
        }),
    );
    if let Err(e) = axum::serve(listener, router)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
    {
        tracing::error!(error = %e, "metrics listener failed");
    }
}
