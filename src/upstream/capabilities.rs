//! The client capabilities one call declares on a 2026-07-28 session.
//!
//! From 2026-07-28 a client declares its capabilities in every request's
//! `_meta` (`io.modelcontextprotocol/clientCapabilities`) rather than once
//! at `initialize`. rmcp puts the session's own capabilities (the
//! handler's `get_info`) in every request and then lays the request
//! options' `_meta` over them, key by key, so a call declares what its
//! worker answers by sending the whole capabilities object in its
//! options. A call that declares nothing beyond the session's sends no
//! override: the same bytes as before questions existed.

#![allow(deprecated)] // sampling: deprecated by SEP-2577, still spoken.

use rmcp::model::{
    ClientCapabilities, ElicitationCapability, FormElicitationCapability, JsonObject,
    RequestMetaObject, SamplingCapability, TASKS_EXTENSION_ID, UrlElicitationCapability,
};

use super::input::CallRequest;

/// The per-request `_meta` of `call` on a 2026-07-28 session whose own
/// capabilities are `session`: the session's capabilities with
/// elicitation (form, URL) and sampling exactly as the call opted in
/// ([`CallRequest::accepts`]); `None` when that is what the session
/// declares anyway (nothing is added to the request).
///
/// So a call that opted in to nothing never advertises elicitation or
/// sampling, even on a session that declares them itself. Other
/// capabilities (roots, other extensions) are the session's; the tasks
/// extension is added when the call may become a task.
pub(super) fn capabilities_meta(
    call: &CallRequest,
    session: &ClientCapabilities,
) -> Option<RequestMetaObject> {
    declared(
        call.accepts,
        call.accepts_task || call.declare_tasks,
        session,
    )
}

/// [`capabilities_meta`] of any request: the kinds of question it
/// `accepts`, and the tasks extension when it may become a `task`.
pub(super) fn declared(
    accepts: super::InputKinds,
    task: bool,
    session: &ClientCapabilities,
) -> Option<RequestMetaObject> {
    let mut capabilities = session.clone();
    let mut elicitation = ElicitationCapability::new();
    if accepts.form {
        elicitation = elicitation.with_form(FormElicitationCapability::new());
    }
    if accepts.url {
        elicitation = elicitation.with_url(UrlElicitationCapability::new());
    }
    capabilities.elicitation = (accepts.form || accepts.url).then_some(elicitation);
    capabilities.sampling = accepts.sampling.then(SamplingCapability::default);
    // The tasks extension (SEP-2663) when the call may become a task: its
    // worker follows tasks, or toolgate resends a call the server refused
    // for want of it.
    if task {
        capabilities
            .extensions
            .get_or_insert_with(Default::default)
            .insert(TASKS_EXTENSION_ID.to_owned(), JsonObject::new());
    }
    if capabilities == *session {
        return None;
    }
    let mut meta = RequestMetaObject::new();
    meta.set_client_capabilities(capabilities);
    Some(meta)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::upstream::InputKinds;

    fn call(accepts: InputKinds) -> CallRequest {
        let mut call = CallRequest::new("t", Default::default(), Duration::from_secs(1));
        call.accepts = accepts;
        call
    }

    fn declared(meta: &RequestMetaObject) -> serde_json::Value {
        serde_json::to_value(meta.client_capabilities()).unwrap()
    }

    #[test]
    fn a_call_that_opted_in_to_nothing_adds_nothing() {
        let plain = ClientCapabilities::default();
        assert_eq!(
            capabilities_meta(&call(InputKinds::default()), &plain),
            None
        );
    }

    #[test]
    fn a_call_declares_exactly_the_kinds_it_accepts() {
        let plain = ClientCapabilities::default();
        let form = InputKinds {
            form: true,
            ..InputKinds::default()
        };
        let meta = capabilities_meta(&call(form), &plain).expect("declared");
        assert_eq!(declared(&meta), json!({"elicitation": {"form": {}}}));
        let all = InputKinds {
            form: true,
            url: true,
            sampling: true,
        };
        let meta = capabilities_meta(&call(all), &plain).expect("declared");
        assert_eq!(
            declared(&meta),
            json!({"elicitation": {"form": {}, "url": {}}, "sampling": {}})
        );
        // Only the capabilities key: rmcp keeps the protocol version and
        // client info of the session.
        assert_eq!(meta.0.0.len(), 1);
    }

    #[test]
    fn an_opted_out_call_does_not_inherit_the_sessions_elicitation() {
        let mut session = ClientCapabilities::default();
        session.elicitation =
            Some(ElicitationCapability::new().with_form(FormElicitationCapability::new()));
        session.roots = Some(Default::default());
        let meta = capabilities_meta(&call(InputKinds::default()), &session).expect("override");
        assert_eq!(declared(&meta), json!({"roots": {}}));
    }
}
