//! `ListPrompts` and `GetPrompt`: a tenant's prompts under exposed names,
//! policy and approvals as for tools (`Complete` is in `complete`).

use tonic::{Request, Status};

use super::Gateway;
use crate::pb;

/// `ListPrompts`.
pub(super) async fn list(
    _gateway: &Gateway,
    _request: Request<pb::ListPromptsRequest>,
) -> Result<pb::ListPromptsResponse, Status> {
    Err(Status::unimplemented("ListPrompts is being built"))
}

/// `GetPrompt`.
pub(super) async fn get(
    _gateway: &Gateway,
    _request: Request<pb::GetPromptRequest>,
) -> Result<pb::GetPromptResponse, Status> {
    Err(Status::unimplemented("GetPrompt is being built"))
}
