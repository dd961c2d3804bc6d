//! TEMPORARY stub of the webhook notifier (the notify branch replaces it).
#![allow(dead_code, missing_docs)]

#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Summary {
    pub(crate) event: &'static str,
    pub(crate) approval_id: String,
    pub(crate) tenant: String,
    pub(crate) tool: String,
    pub(crate) server: String,
    pub(crate) subject: String,
    pub(crate) rule: String,
    pub(crate) arguments_json: String,
    pub(crate) arguments_sha256: String,
    pub(crate) created_at_unix_ms: i64,
    pub(crate) expires_at_unix_ms: i64,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Notifier;

impl Notifier {
    pub(crate) fn notify(&self, _webhook: &(), _summary: Summary) {}
}
