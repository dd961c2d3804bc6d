//! `toolgate.v1.CallApprovalsService`: what approvers do, over
//! [`crate::calls::approval`]: list, read, approve, deny, and watch a
//! tenant's call approvals. Authenticated like ToolGateway (and by the
//! tenant's approver tokens); every refusal goes through the one status
//! table.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::calls::{ApprovalView, Approver, CallError, Calls};
use crate::pb;
use crate::registry::Tenant;
use crate::state::call_approvals::states;

/// How far back a watch looks again each time: changes committed late
/// (a slow transaction, a replica's clock a little behind) are still seen.
const WATCH_OVERLAP_MS: i64 = 5_000;

/// Messages a watch may have queued for a slow client before it ends.
const WATCH_BUFFER: usize = 64;

/// The CallApprovalsService of a gateway.
#[derive(Debug, Clone)]
pub struct CallApprovalsApi {
    calls: Calls,
}

impl CallApprovalsApi {
    /// The service over `calls`' approvals.
    #[must_use]
    pub fn new(calls: Calls) -> Self {
        Self { calls }
    }
}

/// The approver a request authenticated as.
fn approver<T>(request: &Request<T>) -> Result<Approver, Status> {
    let tenant = request
        .extensions()
        .get::<Arc<Tenant>>()
        .cloned()
        .ok_or_else(|| Status::from(CallError::Unauthenticated("no credential was checked")))?;
    let (caller, subject) = super::caller_of(request);
    Ok(Approver {
        tenant,
        caller,
        subject,
    })
}

/// The state a request names (unset: pending).
fn state_name(state: pb::CallApprovalState) -> &'static str {
    match state {
        pb::CallApprovalState::Unspecified | pb::CallApprovalState::Pending => states::PENDING,
        pb::CallApprovalState::Approved => states::APPROVED,
        pb::CallApprovalState::Denied => states::DENIED,
        pb::CallApprovalState::Expired => states::EXPIRED,
        pb::CallApprovalState::Spent => states::SPENT,
    }
}

/// An approval as this API's message.
fn message(view: ApprovalView) -> pb::CallApproval {
    let state = match view.state.as_str() {
        states::PENDING => pb::CallApprovalState::Pending,
        states::APPROVED => pb::CallApprovalState::Approved,
        states::DENIED => pb::CallApprovalState::Denied,
        states::SPENT => pb::CallApprovalState::Spent,
        _ => pb::CallApprovalState::Expired,
    };
    let shown = view.details;
    pb::CallApproval {
        approval_id: view.id,
        state: state as i32,
        tool: shown.tool,
        server: shown.server,
        definition_hash: shown.definition_hash,
        arguments_json: shown.arguments_json,
        arguments_sha256: shown.arguments_sha256,
        subject: view.subject,
        rule: shown.rule,
        created_at_unix_ms: view.created_at_ms,
        expires_at_unix_ms: view.expires_at_ms,
        uses_left: view.uses_left,
        decided_by: shown.decided_by,
        reason: shown.reason,
        decided_at_unix_ms: view.decided_at_ms,
        may_decide: view.may_decide,
    }
}

#[tonic::async_trait]
impl super::server::call_approvals_service_server::CallApprovalsService for CallApprovalsApi {
    async fn list_call_approvals(
        &self,
        request: Request<pb::ListCallApprovalsRequest>,
    ) -> Result<Response<pb::ListCallApprovalsResponse>, Status> {
        let approver = approver(&request)?;
        let request = request.into_inner();
        let limit = if request.limit == 0 {
            100
        } else {
            request.limit
        };
        let views = self
            .calls
            .call_approvals()
            .list(&approver, state_name(request.state()), limit)
            .await?;
        Ok(Response::new(pb::ListCallApprovalsResponse {
            approvals: views.into_iter().map(message).collect(),
        }))
    }

    async fn get_call_approval(
        &self,
        request: Request<pb::GetCallApprovalRequest>,
    ) -> Result<Response<pb::GetCallApprovalResponse>, Status> {
        let approver = approver(&request)?;
        let view = self
            .calls
            .call_approvals()
            .get(&approver, &request.get_ref().approval_id)
            .await?;
        Ok(Response::new(pb::GetCallApprovalResponse {
            approval: Some(message(view)),
        }))
    }

    async fn approve_call(
        &self,
        request: Request<pb::ApproveCallRequest>,
    ) -> Result<Response<pb::ApproveCallResponse>, Status> {
        let approver = approver(&request)?;
        let request = request.into_inner();
        let view = self
            .calls
            .call_approvals()
            .decide(&approver, &request.approval_id, true, &request.reason)
            .await?;
        Ok(Response::new(pb::ApproveCallResponse {
            approval: Some(message(view)),
        }))
    }

    async fn deny_call(
        &self,
        request: Request<pb::DenyCallRequest>,
    ) -> Result<Response<pb::DenyCallResponse>, Status> {
        let approver = approver(&request)?;
        let request = request.into_inner();
        let view = self
            .calls
            .call_approvals()
            .decide(&approver, &request.approval_id, false, &request.reason)
            .await?;
        Ok(Response::new(pb::DenyCallResponse {
            approval: Some(message(view)),
        }))
    }

    type WatchCallApprovalsStream = ReceiverStream<Result<pb::WatchCallApprovalsResponse, Status>>;

    async fn watch_call_approvals(
        &self,
        request: Request<pb::WatchCallApprovalsRequest>,
    ) -> Result<Response<Self::WatchCallApprovalsStream>, Status> {
        let approver = approver(&request)?;
        let approvals = self.calls.call_approvals().clone();
        // The pending ones first; a failure here is the RPC's.
        let since = crate::state::now_ms();
        let pending = approvals
            .list(
                &approver,
                states::PENDING,
                crate::calls::approval::decide::MAX_LIST,
            )
            .await?;
        let (out, receiver) = mpsc::channel(WATCH_BUFFER);
        tokio::spawn(async move {
            // What was sent, by id, with the change it showed.
            let mut sent: HashMap<String, i64> = HashMap::new();
            for view in pending.into_iter().rev() {
                sent.insert(view.id.clone(), view.changed_at_ms);
                let item = pb::WatchCallApprovalsResponse {
                    approval: Some(message(view)),
                };
                if out.send(Ok(item)).await.is_err() {
                    return;
                }
            }
            let mut cursor = since;
            loop {
                tokio::select! {
                    () = out.closed() => return,
                    () = approvals.changes() => {}
                }
                let changes = match approvals
                    .changed_since(&approver, cursor.saturating_sub(WATCH_OVERLAP_MS))
                    .await
                {
                    Ok(changes) => changes,
                    Err(error) => {
                        let _ = out.send(Err(error.into())).await;
                        return;
                    }
                };
                for view in changes {
                    let changed_at_ms = view.changed_at_ms;
                    cursor = cursor.max(changed_at_ms);
                    if sent.get(&view.id) == Some(&changed_at_ms) {
                        continue;
                    }
                    sent.insert(view.id.clone(), changed_at_ms);
                    let item = pb::WatchCallApprovalsResponse {
                        approval: Some(message(view)),
                    };
                    if out.send(Ok(item)).await.is_err() {
                        return;
                    }
                }
                // Forget what is older than the overlap: it cannot come back.
                let horizon = cursor.saturating_sub(2 * WATCH_OVERLAP_MS);
                sent.retain(|_, changed| *changed >= horizon);
            }
        });
        Ok(Response::new(ReceiverStream::new(receiver)))
    }
}
