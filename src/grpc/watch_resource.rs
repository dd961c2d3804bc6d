//! `WatchResource`: one resource's updates, from a refcounted upstream
//! subscription per session and URI, ended with a status when the server,
//! the caller's credential or the configuration goes.

use tonic::{Request, Status};

use super::{EventStream, Gateway};
use crate::pb;

/// `WatchResource`: checks the request, then streams.
pub(super) async fn start(
    _gateway: &Gateway,
    _request: Request<pb::WatchResourceRequest>,
) -> Result<EventStream<pb::ResourceUpdate>, Status> {
    Err(Status::unimplemented("WatchResource is being built"))
}
