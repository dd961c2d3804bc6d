//! TEMPORARY: the call-time verdict API the policy branch delivers; removed
//! on merge.
#![allow(missing_docs, dead_code, clippy::unused_self)]

use std::sync::Arc;
use std::time::Duration;

use super::Policy;
use crate::callers::{Caller, Subject};
use crate::catalog::{CatalogPrompt, CatalogTool};

#[derive(Debug, Clone)]
pub enum Verdict {
    Allow,
    Deny { rule: String, failed: bool },
    RequireApproval(Arc<ApprovalRule>),
}

#[derive(Debug)]
pub struct ApprovalRule {
    pub path: String,
    pub digest: String,
    pub wait: Duration,
    pub valid_for: Duration,
    pub uses: u32,
    pub self_approval: bool,
}

impl ApprovalRule {
    pub fn admits(&self, _caller: &Caller, _subject: &Subject) -> bool {
        false
    }
}

impl Policy {
    pub fn decides_at_call(&self, _name: &str) -> bool {
        false
    }
    pub fn decide_call(
        &self,
        _caller: &Caller,
        _subject: &Subject,
        _tool: &CatalogTool,
        _arguments: &serde_json::Map<String, serde_json::Value>,
    ) -> Verdict {
        Verdict::Allow
    }
    pub fn decides_prompt_at_call(&self, _name: &str) -> bool {
        false
    }
    pub fn decide_prompt(
        &self,
        _caller: &Caller,
        _subject: &Subject,
        _prompt: &CatalogPrompt,
        _arguments: &serde_json::Map<String, serde_json::Value>,
    ) -> Verdict {
        Verdict::Allow
    }
    pub fn approval_rule(&self, _path: &str) -> Option<Arc<ApprovalRule>> {
        None
    }
}
