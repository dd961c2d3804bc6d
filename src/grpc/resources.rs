//! `ListResources` and `ReadResource`: a tenant's resources, read through
//! from its servers (per subject for per-user servers), under the tenant's
//! resource policy, redaction and limits.

use tonic::{Request, Status};

use super::Gateway;
use crate::pb;

/// `ListResources`.
pub(super) async fn list(
    _gateway: &Gateway,
    _request: Request<pb::ListResourcesRequest>,
) -> Result<pb::ListResourcesResponse, Status> {
    Err(Status::unimplemented("ListResources is being built"))
}

/// `ReadResource`.
pub(super) async fn read(
    _gateway: &Gateway,
    _request: Request<pb::ReadResourceRequest>,
) -> Result<pb::ReadResourceResponse, Status> {
    Err(Status::unimplemented("ReadResource is being built"))
}
