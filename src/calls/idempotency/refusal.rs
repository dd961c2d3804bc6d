//! Why a call with an idempotency key was not run, and a recorded
//! failure answered again: the errors of [`super`], apart so that the
//! error table can name them without importing the step.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use serde::{Deserialize, Serialize};

/// Why a call with an idempotency key was not run.
#[derive(Debug, thiserror::Error)]
pub enum KeyRefusal {
    /// The key is malformed, or the field and the metadata differ.
    #[error("idempotency key: {0}")]
    Invalid(&'static str),
    /// The key was used with other arguments.
    #[error(
        "the idempotency key was used by call {call_id} with other arguments: a key names one call; give new arguments a new key"
    )]
    Reused {
        /// The call that claimed it.
        call_id: String,
    },
    /// The call that claimed the key has not ended (this one's deadline
    /// came first: a retry that waited for it, or the keyed call itself,
    /// which goes on at the gateway).
    #[error(
        "the call{} with this idempotency key is still in progress at the gateway: retry with the same key to get its outcome",
        if .call_id.is_empty() { String::new() } else { format!(" {}", .call_id) }
    )]
    InProgress {
        /// The call that claimed it (empty: this call itself).
        call_id: String,
    },
    /// The call that claimed the key may or may not have acted.
    #[error(
        "call {call_id} with this idempotency key ended without a definite outcome (the tool may have acted); it is never sent again under this key: check its effect, then call with a new key"
    )]
    InDoubt {
        /// The call that claimed it.
        call_id: String,
    },
    /// The call completed; its response was not kept.
    #[error(
        "call {call_id} with this idempotency key completed, but its response was not kept ({why}); it is not sent again"
    )]
    NotKept {
        /// The call that claimed it.
        call_id: String,
        /// Why the response is not here.
        why: String,
        /// The task it became, if it became one.
        task_id: Option<String>,
    },
    /// The tenant has its most live keys.
    #[error(
        "this tenant has {limit} live idempotency keys, the most it may have (idempotency.max_keys): retry later, or without a key"
    )]
    Limit {
        /// The limit.
        limit: u64,
    },
    /// The state store cannot be reached: nothing was sent.
    #[error("idempotency keys need the state store, which {reason}; nothing was sent, retry")]
    StoreUnavailable {
        /// Why (without secrets).
        reason: String,
    },
}

impl KeyRefusal {
    /// What its status's metadata says besides the reason.
    pub(crate) fn metadata(&self, metadata: &mut HashMap<String, String>) {
        match self {
            Self::Reused { call_id } | Self::InProgress { call_id } | Self::InDoubt { call_id }
                if !call_id.is_empty() =>
            {
                metadata.insert("call_id".to_owned(), call_id.clone());
            }
            Self::Reused { .. } | Self::InProgress { .. } | Self::InDoubt { .. } => {}
            Self::NotKept {
                call_id, task_id, ..
            } => {
                metadata.insert("call_id".to_owned(), call_id.clone());
                if let Some(task) = task_id {
                    metadata.insert("task_id".to_owned(), task.clone());
                }
            }
            Self::Limit { limit } => {
                metadata.insert("limit".to_owned(), "idempotency.max_keys".to_owned());
                metadata.insert("limit_value".to_owned(), limit.to_string());
            }
            Self::Invalid(_) | Self::StoreUnavailable { .. } => {}
        }
    }

    /// The `outcome` label and audit value of the refusal.
    pub(crate) fn outcome(&self) -> &'static str {
        match self {
            Self::Reused { .. } => "reused",
            Self::InProgress { .. } => "in_progress",
            Self::InDoubt { .. } => "in_doubt",
            Self::NotKept { .. } => "not_kept",
            Self::Limit { .. } => "limit",
            Self::Invalid(_) | Self::StoreUnavailable { .. } => "refused",
        }
    }
}

/// A status recorded for a key and answered again to a retry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedStatus {
    /// The gRPC code, as its number.
    pub code: i32,
    /// The stable reason.
    pub reason: String,
    /// The message the first call's caller got.
    pub message: String,
    /// The call that ran.
    #[serde(skip)]
    pub call_id: String,
}

impl RecordedStatus {
    /// The code.
    pub(crate) fn code(&self) -> tonic::Code {
        tonic::Code::from_i32(self.code)
    }

    /// The reason, as the classification table's `&'static str`: reasons
    /// are the gateway's own (a sealed record only holds what a gateway
    /// wrote), so the set is small; past a bound, `CALL_FAILED`.
    pub(crate) fn reason(&self) -> &'static str {
        static REASONS: OnceLock<Mutex<HashMap<String, &'static str>>> = OnceLock::new();
        let mut reasons = REASONS
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(reason) = reasons.get(&self.reason) {
            return reason;
        }
        if reasons.len() >= 256 {
            return "CALL_FAILED";
        }
        let leaked: &'static str = Box::leak(self.reason.clone().into_boxed_str());
        reasons.insert(self.reason.clone(), leaked);
        leaked
    }
}
