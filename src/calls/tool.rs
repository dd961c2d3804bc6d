//! A tool call (`InvokeTool`, `InvokeToolStream`,
//! `InvokeToolInteractive`) as an operation of the pipeline: its name
//! resolved in the caller's catalog (with plan pins and the policy, in
//! [`super::route`]), its arguments, `tools/call` with its progress and
//! questions, and a task when the call accepts one.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolResult, CreateTaskResult, JsonObject};

use super::error::{CallError, quoted};
use super::pipeline::{Operation, Reached, Routed, Sending, Upstream};
use super::rounds::{InputFields, Method, asking};
use super::route::{self, Plan};
use super::viewer::Viewer;
use super::{Calls, LIST_SETTLE_WAIT, Origin, tasks};
use crate::catalog::Catalog;
use crate::pb::guard::TargetKind;
use crate::registry::{Resolved, SessionUnavailable};
use crate::upstream::{CallRequest, InputSink, Session, UpstreamError};

/// Where a call's progress notifications go.
pub type ProgressSink = tokio::sync::mpsc::Sender<rmcp::model::ProgressNotificationParam>;

/// Where a call's events go besides its result: progress (streams) and
/// questions for its worker (interactive calls).
#[derive(Debug, Default)]
pub struct Sinks {
    /// Progress notifications of the server.
    pub progress: Option<ProgressSink>,
    /// Questions of the server, answered by the worker on its stream.
    pub asker: Option<InputSink>,
    /// Set for a call that waits for a person's approval when a
    /// `require_approval` rule holds it (interactive): told the approval's
    /// id, it waits for the decision.
    pub approval: Option<super::ApprovalSink>,
}

/// One tool call.
#[derive(Debug, Default)]
pub struct ToolCall {
    /// The exposed name (`server__tool`).
    pub name: String,
    /// The arguments, a JSON object (empty: `{}`).
    pub arguments_json: String,
    /// The definition hash the caller's plan saw (empty: none pinned).
    pub definition_hash: String,
    /// The catalog version the caller's plan saw (empty: none pinned).
    pub catalog_version: String,
    /// Rounds of questions: what the caller answers, a retry's state and
    /// answers.
    pub input: InputFields,
    /// Whether the caller follows a task itself.
    pub accepts_task: bool,
    /// The call approval this call spends (empty: none named).
    pub approval_id: String,
    /// The idempotency key that makes a retry of this call safe (empty:
    /// none; see [`super::idempotency`]).
    pub idempotency_key: String,
    /// The held task this call starts (its id and expiry; set only when
    /// a held task's approval was given).
    pub(crate) adopt: Option<(String, i64)>,
    /// Where progress and questions go.
    pub sinks: Sinks,
}

/// What a resolved call keeps: the catalog it resolved in and the tool's
/// place in it.
pub(crate) struct Resolution {
    catalog: Arc<Catalog>,
    position: usize,
}

impl Resolution {
    fn tool(&self) -> &crate::catalog::CatalogTool {
        &self.catalog.tools()[self.position]
    }
}

impl ToolCall {
    fn plan(&self) -> Plan<'_> {
        Plan {
            name: &self.name,
            definition_hash: &self.definition_hash,
            catalog_version: &self.catalog_version,
        }
    }

    /// The session of the tool's server in the tenant object that
    /// replaced the one the call routed by, once that one has settled
    /// (bounded): `None` when the name now routes elsewhere or nowhere.
    async fn replaced_session(&self, routed: &Routed<Resolution>) -> Option<Arc<Session>> {
        let newer = routed.tenant.replacement()?;
        let catalog = newer.settled_catalog(LIST_SETTLE_WAIT).await;
        let Resolved { tenant, catalog } = newer.resolve(catalog).ok()?;
        let tool = catalog.get(&self.name)?;
        let was = routed.kind.tool();
        if tool.server != was.server || tool.upstream_name != was.upstream_name {
            return None;
        }
        tenant.session(tool.server_index).ok()
    }
}

impl Operation for ToolCall {
    type Output = CallToolResult;
    type Extra = Resolution;

    const FEATURE: Option<super::error::Feature> = None;
    const GUARDED: Option<TargetKind> = Some(TargetKind::Tool);
    const ROUNDS: Option<Method> = Some(Method::Call);
    const IDEMPOTENT: bool = false;
    const TOOL_SERIES: bool = true;

    fn span(&self, tenant: &str) -> tracing::Span {
        tracing::info_span!(
            "InvokeTool",
            otel.name = "toolgate.v1.ToolGateway/InvokeTool",
            otel.kind = "server",
            otel.status_code = tracing::field::Empty,
            rpc.system = "grpc",
            rpc.service = "toolgate.v1.ToolGateway",
            rpc.method = "InvokeTool",
            rpc.grpc.status_code = tracing::field::Empty,
            tenant = %tenant,
            gen_ai.tool.name = %quoted(&self.name),
            server = tracing::field::Empty,
            outcome = tracing::field::Empty,
        )
    }

    fn describe(&self, record: &mut crate::audit::Record, _tenant: &crate::registry::Tenant) {
        record.tool = Some(quoted(&self.name).into_owned());
    }

    fn audited_arguments(&self) -> Option<std::borrow::Cow<'_, str>> {
        Some(self.arguments_json.as_str().into())
    }

    fn check(&self) -> Result<(), CallError> {
        route::check_name(&self.name)?;
        if !self.idempotency_key.is_empty() {
            super::idempotency::check_key(&self.idempotency_key).map_err(CallError::Keyed)?;
        }
        Ok(())
    }

    fn idempotency_key(&self) -> Option<&str> {
        (!self.idempotency_key.is_empty()).then_some(self.idempotency_key.as_str())
    }

    fn unrouted_key(&self) -> Option<super::idempotency::KeyedCall<'_>> {
        let key = self.idempotency_key()?;
        let arguments = parse_arguments(&self.name, &self.arguments_json).ok()?;
        Some(super::idempotency::KeyedCall {
            key,
            tool: &self.name,
            request_state: &self.input.request_state,
            arguments_sha256: super::rounds::arguments_digest(&arguments),
            longest: Duration::ZERO,
        })
    }

    async fn resolve(
        &self,
        origin: &Origin,
        reached: &mut Reached,
    ) -> Result<Routed<Resolution>, CallError> {
        let name = self.name.as_str();
        let resolved = route::resolve(&origin.tenant, name, origin.deadline).await?;
        let who = route::Caller {
            caller: &origin.caller,
            subject: &origin.subject,
            deadline: origin.deadline,
        };
        let Resolved { tenant, catalog } =
            route::first_delegated_listing(resolved, name, &who).await?;
        // How this caller reads catalogs: under the policy of the tenant
        // that built the one it routes by.
        let viewer = Viewer {
            policy: tenant.policy().map(AsRef::as_ref),
            caller: &origin.caller,
            subject: &origin.subject,
        };
        let Some(position) = catalog.position(name) else {
            return Err(route::not_routable(
                &tenant,
                &catalog,
                &self.plan(),
                &viewer,
                &mut reached.server,
            )
            .await);
        };
        let tool = &catalog.tools()[position];
        // The tool's series and what the record says, before the policy
        // is asked: a refused call is counted under its tool.
        reached.server = Some(tool.server.clone());
        reached.definition_hash = Some(tool.definition_hash.clone());
        reached.tool_series = reached
            .series
            .as_ref()
            .map(|series| series.tool(&tool.server, name));
        let idempotent = tool.annotations.idempotent == Some(true);
        reached.idempotent = idempotent;
        // Before anything else about the tool is told or done.
        route::permitted(&viewer, &catalog, tool)?;
        route::check_pins(&tenant, &catalog, tool, &self.plan(), &viewer)?;
        Ok(Routed {
            index: tool.server_index,
            server: tool.server.clone(),
            upstream_name: tool.upstream_name.clone(),
            target: name.into(),
            definition_hash: tool.definition_hash.clone(),
            idempotent,
            tenant,
            kind: Resolution { catalog, position },
        })
    }

    fn arguments(
        &self,
        routed: &Routed<Resolution>,
        limit: usize,
    ) -> Result<JsonObject, CallError> {
        let _ = routed;
        if self.arguments_json.len() > limit {
            return Err(CallError::ArgumentsTooLarge {
                tool: self.name.as_str().into(),
                size: self.arguments_json.len(),
                limit,
            });
        }
        parse_arguments(&self.name, &self.arguments_json)
    }

    fn verdict(
        &self,
        routed: &Routed<Resolution>,
        origin: &Origin,
        arguments: &JsonObject,
    ) -> crate::policy::Verdict {
        match routed.tenant.policy() {
            Some(policy) if policy.decides_at_call(&self.name) => policy.decide_call(
                &origin.caller,
                &origin.subject,
                routed.kind.tool(),
                arguments,
            ),
            _ => crate::policy::Verdict::Allow,
        }
    }

    fn approving(&self) -> super::Approving<'_> {
        super::Approving {
            approval_id: &self.approval_id,
            waiting: self.sinks.approval.as_ref(),
            parks: self.accepts_task,
        }
    }

    async fn park(
        &self,
        routed: &Routed<Resolution>,
        origin: &Origin,
        notice: &super::ApprovalNotice,
        calls: &Calls,
    ) -> Result<tasks::Task, CallError> {
        let parked = tasks::Parked {
            tenant: &routed.tenant.name,
            subject: origin.subject.key(),
            server: &routed.server,
            tool: &self.name,
            arguments_json: &self.arguments_json,
            ttl: routed.config().input.task_ttl,
        };
        tasks::park(&tasks::Events::of(calls), &parked, notice).await
    }

    fn input(&self) -> Option<&InputFields> {
        Some(&self.input)
    }

    fn definition_changed(&self, routed: &Routed<Resolution>, origin: &Origin) -> CallError {
        let viewer = Viewer {
            policy: routed.tenant.policy().map(AsRef::as_ref),
            caller: &origin.caller,
            subject: &origin.subject,
        };
        super::rounds::definition_changed(routed.kind.tool(), &viewer, &routed.kind.catalog)
    }

    async fn session(
        &self,
        routed: &Routed<Resolution>,
        origin: &Origin,
    ) -> Result<Arc<Session>, CallError> {
        let tenant = &routed.tenant;
        if !tenant.is_per_user(routed.index)
            && let Err(SessionUnavailable::Down(_)) = tenant.session(routed.index)
            && tenant.replacement().is_some()
            // Replaced between routing and now (a reload, a change of a
            // stored tenant): nothing was sent, so the call goes to the
            // server of this name in the tenant now.
            && let Some(session) = self.replaced_session(routed).await
        {
            return Ok(session);
        }
        super::session::session(
            tenant,
            routed.index,
            &origin.subject,
            &routed.target,
            routed.idempotent,
        )
        .await
    }

    async fn ready(
        &self,
        routed: &Routed<Resolution>,
        _session: &Session,
        calls: &Calls,
    ) -> Result<(), CallError> {
        // A task the state store cannot keep must not reach the server.
        if self.accepts_task && routed.config().input.tasks {
            tasks::admit(
                &tasks::Events::of(calls),
                &routed.tenant.name,
                &routed.server,
            )
            .await?;
        }
        Ok(())
    }

    fn default_timeout(&self, routed: &Routed<Resolution>) -> Duration {
        routed.config().timeout_for(&routed.upstream_name)
    }

    async fn send(
        &self,
        sending: Sending<'_, Resolution>,
    ) -> Result<Result<Upstream<CallToolResult>, UpstreamError>, CallError> {
        let Sending {
            routed,
            session,
            arguments,
            timeout,
            accepts,
            answered,
            round,
            binding,
            audited,
            calls,
            origin,
        } = sending;
        let config = routed.config();
        let mut call = CallRequest::new(routed.upstream_name.clone(), arguments, timeout);
        call.inherited_trace.clone_from(&origin.trace);
        call.progress = self.sinks.progress.clone();
        call.accepts = accepts;
        call.accepts_task = self.accepts_task && config.input.tasks;
        call.tasks_allowed = config.input.tasks;
        if let Some((responses, state)) = answered {
            call.input_responses = Some(responses);
            call.request_state = state;
        }
        let Some(binding) = binding else {
            return Ok(Err(UpstreamError::Protocol(
                "a call without its binding".to_owned(),
            )));
        };
        // Every round put to the worker goes through the asking relay, on
        // record.
        let asking = asking::Asking {
            audited,
            metrics: &calls.metrics,
            binding,
            redactor: || routed.tenant.redactor(),
            era: asking::era(session),
            first: round,
            idempotent: routed.idempotent,
        };
        let result = asking
            .call(session, &mut call, self.sinks.asker.clone())
            .await?;
        Ok(result.map(Upstream::from))
    }

    async fn task(
        &self,
        routed: &Routed<Resolution>,
        session: &Arc<Session>,
        created: CreateTaskResult,
        calls: &Calls,
        origin: &Origin,
    ) -> Result<tasks::Task, CallError> {
        // Only a call with accepts_task ends here (Session::call follows
        // any other task itself): the worker gets toolgate's task.
        let events = tasks::Events::of(calls);
        let started = tasks::Started {
            tenant: &routed.tenant,
            server: routed.config(),
            tool: routed.kind.tool(),
            subject: &origin.subject,
            events: &events,
            idempotent: routed.idempotent,
            adopt: self
                .adopt
                .as_ref()
                .map(|(id, expires)| (id.as_str(), *expires)),
        };
        tasks::start(&started, session, created).await
    }
}

/// Parses `arguments_json`: empty means `{}`; anything but an object is
/// refused, saying what it is.
///
/// # Errors
/// The text is not empty and not a JSON object.
pub fn parse_arguments(tool: &str, text: &str) -> Result<rmcp::model::JsonObject, CallError> {
    let invalid = |reason: String| CallError::InvalidArguments {
        tool: (tool.to_owned()).into(),
        reason,
    };
    if text.trim().is_empty() {
        return Ok(rmcp::model::JsonObject::new());
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(other) => Err(invalid(format!(
            "must be a JSON object, but is {}",
            match other {
                serde_json::Value::Null => "null",
                serde_json::Value::Bool(_) => "a boolean",
                serde_json::Value::Number(_) => "a number",
                serde_json::Value::String(_) => "a string",
                serde_json::Value::Array(_) => "an array",
                serde_json::Value::Object(_) => unreachable!(),
            }
        ))),
        Err(e) => Err(invalid(format!("is not valid JSON: {e}"))),
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_must_be_an_object() {
        assert!(parse_arguments("t", "").unwrap().is_empty());
        assert!(
            parse_arguments("t", " {\"a\": 1} ")
                .unwrap()
                .contains_key("a")
        );
        let err = parse_arguments("t", "[1]").unwrap_err().to_string();
        assert!(err.contains("an array"), "{err}");
        let err = parse_arguments("t", "{nope").unwrap_err().to_string();
        assert!(err.contains("not valid JSON"), "{err}");
    }
}
