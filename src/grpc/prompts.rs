//! `ListPrompts`, `GetPrompt` and `Complete`: a tenant's prompts under
//! exposed names, policy and approvals as for tools, and argument
//! completion for prompts and resource templates.

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

/// `Complete`.
pub(super) async fn complete(
    _gateway: &Gateway,
    _request: Request<pb::CompleteRequest>,
) -> Result<pb::CompleteResponse, Status> {
    Err(Status::unimplemented("Complete is being built"))
}
