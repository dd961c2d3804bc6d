//! The call path's series, resolved once per tenant and per (server, tool)
//! rather than per call: a call looks its handles up by borrowed names and
//! increments them, building no label strings and taking no family lock.
//!
//! Every series is still created on first use, through its family, so
//! `/metrics` shows exactly the series it showed when each call resolved
//! its own labels.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use super::{CallLabels, ServerLabels, TenantLabels, UpstreamLabels};

/// The method label of a tool call's upstream request.
const TOOLS_CALL: &str = "tools/call";

/// The families the call path writes to (each a shared handle).
#[derive(Debug, Clone)]
pub(super) struct CallFamilies {
    pub(super) calls: Family<CallLabels, Counter>,
    pub(super) call_duration: Family<ServerLabels, Histogram, fn() -> Histogram>,
    pub(super) upstream_duration: Family<UpstreamLabels, Histogram, fn() -> Histogram>,
    pub(super) in_flight: Family<TenantLabels, Gauge>,
}

/// Series of every tenant, by name.
#[derive(Debug, Default)]
pub(super) struct CallSeries {
    tenants: RwLock<HashMap<String, Arc<TenantCalls>>>,
}

impl CallSeries {
    /// The series of `tenant`, created on its first call.
    pub(super) fn tenant(&self, families: &CallFamilies, tenant: &str) -> Arc<TenantCalls> {
        if let Some(found) = read(&self.tenants).get(tenant) {
            return found.clone();
        }
        write(&self.tenants)
            .entry(tenant.to_owned())
            .or_insert_with(|| {
                Arc::new(TenantCalls {
                    families: families.clone(),
                    tenant: tenant.to_owned(),
                    in_flight: OnceLock::new(),
                    tools: RwLock::default(),
                })
            })
            .clone()
    }
}

/// One tenant's call series: calls in flight, and the series of each
/// (server, tool) it has called.
#[derive(Debug)]
pub struct TenantCalls {
    families: CallFamilies,
    tenant: String,
    in_flight: OnceLock<Gauge>,
    /// Server label, then tool label.
    tools: RwLock<HashMap<String, HashMap<String, Arc<ToolCalls>>>>,
}

impl TenantCalls {
    /// Marks a call as running until the guard is dropped
    /// (`toolgate_calls_in_flight`).
    pub fn in_flight(&self) -> InFlight {
        let gauge = self
            .in_flight
            .get_or_init(|| {
                self.families.in_flight.get_or_create_owned(&TenantLabels {
                    tenant: self.tenant.clone(),
                })
            })
            .clone();
        gauge.inc();
        InFlight { gauge }
    }

    /// The series of calls labelled `server` and `tool` (either may be
    /// empty: a call that did not get that far).
    pub fn tool(&self, server: &str, tool: &str) -> Arc<ToolCalls> {
        if let Some(found) = read(&self.tools).get(server).and_then(|t| t.get(tool)) {
            return found.clone();
        }
        write(&self.tools)
            .entry(server.to_owned())
            .or_default()
            .entry(tool.to_owned())
            .or_insert_with(|| {
                Arc::new(ToolCalls {
                    families: self.families.clone(),
                    tenant: self.tenant.clone(),
                    server: server.to_owned(),
                    tool: tool.to_owned(),
                    duration: OnceLock::new(),
                    upstream: OnceLock::new(),
                    ok: OnceLock::new(),
                    tool_error: OnceLock::new(),
                })
            })
            .clone()
    }
}

/// The series of one (tenant, server, tool): the handles of the frequent
/// outcomes and of both latencies, each resolved on first use.
#[derive(Debug)]
pub struct ToolCalls {
    families: CallFamilies,
    tenant: String,
    server: String,
    tool: String,
    duration: OnceLock<Histogram>,
    upstream: OnceLock<Histogram>,
    ok: OnceLock<Counter>,
    tool_error: OnceLock<Counter>,
}

impl ToolCalls {
    /// Counts a finished call (`toolgate_calls_total`) and its latency
    /// (`toolgate_call_duration_seconds`).
    pub fn finished(&self, outcome: &str, seconds: f64) {
        let counter = |outcome: &str| {
            self.families.calls.get_or_create_owned(&CallLabels {
                tenant: self.tenant.clone(),
                server: self.server.clone(),
                tool: self.tool.clone(),
                outcome: outcome.to_owned(),
            })
        };
        match outcome {
            "ok" => self.ok.get_or_init(|| counter(outcome)).inc(),
            "tool_error" => self.tool_error.get_or_init(|| counter(outcome)).inc(),
            // Failures: rarer, and their labels are resolved per call.
            _ => counter(outcome).inc(),
        };
        self.duration
            .get_or_init(|| {
                self.families
                    .call_duration
                    .get_or_create_owned(&ServerLabels {
                        tenant: self.tenant.clone(),
                        server: self.server.clone(),
                    })
            })
            .observe(seconds);
    }

    /// Records the latency of the call's `tools/call` request
    /// (`toolgate_upstream_request_duration_seconds`).
    pub fn upstream_finished(&self, seconds: f64) {
        self.upstream
            .get_or_init(|| {
                self.families
                    .upstream_duration
                    .get_or_create_owned(&UpstreamLabels {
                        tenant: self.tenant.clone(),
                        server: self.server.clone(),
                        method: TOOLS_CALL.to_owned(),
                    })
            })
            .observe(seconds);
    }
}

/// Keeps a call counted as in flight while alive.
#[derive(Debug)]
pub struct InFlight {
    gauge: Gauge,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// A read guard, whether or not a writer panicked (the maps stay valid:
/// every write is a single insertion).
fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A write guard, whether or not a writer panicked.
fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::super::Metrics;

    #[test]
    fn resolved_series_count_like_per_call_labels() {
        let metrics = Metrics::new();
        let tenant = metrics.calls("t");
        {
            let _running = tenant.in_flight();
            assert!(
                metrics
                    .encode()
                    .contains("toolgate_calls_in_flight{tenant=\"t\"} 1\n")
            );
        }
        let echo = tenant.tool("srv", "srv__echo");
        echo.upstream_finished(0.001);
        echo.finished("ok", 0.002);
        // Resolved again (a later call) it is the same series.
        metrics
            .calls("t")
            .tool("srv", "srv__echo")
            .finished("ok", 0.002);
        echo.finished("UPSTREAM_ERROR", 0.002);
        tenant.tool("", "").finished("DRAINING", 0.0);
        let text = metrics.encode();
        for line in [
            "toolgate_calls_in_flight{tenant=\"t\"} 0\n",
            "toolgate_calls_total{tenant=\"t\",server=\"srv\",tool=\"srv__echo\",outcome=\"ok\"} 2\n",
            "toolgate_calls_total{tenant=\"t\",server=\"srv\",tool=\"srv__echo\",outcome=\"UPSTREAM_ERROR\"} 1\n",
            "toolgate_calls_total{tenant=\"t\",server=\"\",tool=\"\",outcome=\"DRAINING\"} 1\n",
            "toolgate_call_duration_seconds_count{tenant=\"t\",server=\"srv\"} 3\n",
            "toolgate_call_duration_seconds_count{tenant=\"t\",server=\"\"} 1\n",
            "toolgate_upstream_request_duration_seconds_count{tenant=\"t\",server=\"srv\",method=\"tools/call\"} 1\n",
        ] {
            assert!(text.contains(line), "{line:?} missing from:\n{text}");
        }
        // Series appear on first use only, as before.
        assert!(!text.contains("outcome=\"tool_error\""), "{text}");
        assert!(
            !text.contains(
                "toolgate_upstream_request_duration_seconds_count{tenant=\"t\",server=\"\""
            ),
            "{text}"
        );
    }

    #[test]
    fn a_tenant_without_calls_shows_no_in_flight_series() {
        let metrics = Metrics::new();
        metrics
            .calls("quiet")
            .tool("", "")
            .finished("DRAINING", 0.0);
        assert!(!metrics.encode().contains("toolgate_calls_in_flight{"));
    }
}
