//! Call approvals: tool calls a `require_approval` policy rule holds until
//! an approver decides. (Placeholder of the notify branch: the pipeline's
//! step and the approvers' service come with the rest of the room.)

// Used by the approval step, which another branch adds.
#[allow(dead_code)]
pub(crate) mod notify;
