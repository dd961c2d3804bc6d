//! Call approvals: a tool call that a policy rule with `require_approval`
//! holds until a person approves exactly that call (docs/call-approvals.md).
//! Not to be confused with approved tool definitions (`crate::approvals`),
//! which decide what a catalog serves at all.
//!
//! An approval is bound to the call that asked for it ([`binding`]): the
//! tenant, the subject, the exposed name, the server, the tool's definition
//! hash, the digest of the canonical arguments, and the rule that asked
//! with the rule's own digest. It lives in the state store, so any replica
//! takes the request, the decision and the retry that spends it. Here: what
//! a held call does (the pipeline's step, [`hold`]), what approvers do
//! ([`decide`]), the sweep of expired approvals ([`sweep`]) and the
//! webhook that tells people a decision is wanted ([`notify`]).
//!
//! The order of the checks on one call (the pipeline's steps 3 to 11):
//! the policy without the arguments (what listings show), the policy with
//! them (a rule that reads `args` or requires approval), the approval,
//! then the guards. So a person is asked only about a call the policy
//! lets through, and the guards see a call only once it is approved.

pub mod decide;
mod hold;
pub(crate) mod notify;
pub mod sweep;

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

pub use hold::{ApprovalNotice, ApprovalSink, Approving};
pub(crate) use hold::{Held, Hold, hold, return_use};

use crate::state::StateStore;
use crate::telemetry::Metrics;

/// How often a call that waits for a decision, and a watch, look at the
/// state store: a decision made at this replica wakes them at once, one
/// made at another announced on PostgreSQL too (`LISTEN`), so they look
/// this often only without a listener, and [`POLL_LISTENING`] with one.
const POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// How often they look while this replica listens to the others'
/// announcements (a lost notice costs at most this much).
const POLL_LISTENING: std::time::Duration = std::time::Duration::from_secs(5);

/// What calls and approvers share: the store, the trail, the metrics,
/// the webhook and the wake-up of calls waiting at this replica.
#[derive(Debug, Clone)]
pub struct CallApprovals {
    pub(super) store: Option<StateStore>,
    pub(super) audit: crate::audit::Audit,
    metrics: Arc<Metrics>,
    pub(super) notifier: notify::Notifier,
    /// Woken by every decision made at this replica, and every request
    /// or decision another announced.
    decided: Arc<tokio::sync::Notify>,
    /// Whether this replica listens to the others' announcements now.
    listening: Arc<std::sync::atomic::AtomicBool>,
}

impl CallApprovals {
    /// Call approvals kept in `store` (`None`: none can be asked for).
    pub(crate) fn new(
        store: Option<StateStore>,
        audit: crate::audit::Audit,
        metrics: Arc<Metrics>,
        notifier: notify::Notifier,
    ) -> Self {
        Self {
            store,
            audit,
            metrics,
            notifier,
            decided: Arc::new(tokio::sync::Notify::new()),
            listening: Arc::default(),
        }
    }

    /// How long a waiting call or a watch sleeps between looks at the
    /// store.
    fn poll(&self) -> std::time::Duration {
        if self.listening.load(std::sync::atomic::Ordering::Relaxed) {
            POLL_LISTENING
        } else {
            POLL
        }
    }

    /// The state store, or the refusal of a call that needs it.
    fn store(&self) -> Result<&StateStore, crate::calls::CallError> {
        self.store
            .as_ref()
            .ok_or(crate::calls::CallError::ApprovalStoreUnavailable {
                reason: "is not configured (state.url)",
            })
    }
}

/// A store failure as the refusal of what needed it (nothing was sent).
fn unavailable(error: &crate::state::StateError) -> crate::calls::CallError {
    tracing::warn!(%error, "the state store failed a call approval's step");
    crate::calls::CallError::ApprovalStoreUnavailable {
        reason: match error {
            crate::state::StateError::Unavailable(_) => "cannot be reached",
            _ => "could not read or write it",
        },
    }
}

/// What the state store keeps of an approval, sealed: what an approver is
/// shown and what was decided.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Details {
    /// The tool's exposed name.
    pub(crate) tool: String,
    /// Its server.
    pub(crate) server: String,
    /// The tool's definition hash when the approval was asked for.
    pub(crate) definition_hash: String,
    /// The SHA-256 of the canonical arguments (what is bound).
    pub(crate) arguments_sha256: String,
    /// The arguments as JSON, redacted for the approver.
    pub(crate) arguments_json: String,
    /// The rule that asked.
    pub(crate) rule: String,
    /// That rule's digest when it asked.
    pub(crate) rule_digest: String,
    /// Who asked (the caller, as the audit trail names it).
    pub(crate) requested_by: String,
    /// Who decided (empty: undecided).
    #[serde(default)]
    pub(crate) decided_by: String,
    /// Their reason.
    #[serde(default)]
    pub(crate) reason: String,
}

impl Details {
    /// The value the store seals.
    fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("details serialize")
    }

    /// A stored value.
    fn from_bytes(bytes: &[u8]) -> Result<Self, crate::calls::CallError> {
        serde_json::from_slice(bytes).map_err(|_| {
            crate::calls::CallError::ApprovalStoreUnavailable {
                reason: "holds a call approval this gateway cannot read",
            }
        })
    }
}

/// What one approval binds, each part as the call has it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bound<'a> {
    pub(crate) tenant: &'a str,
    pub(crate) subject: &'a str,
    pub(crate) tool: &'a str,
    pub(crate) server: &'a str,
    pub(crate) definition_hash: &'a str,
    pub(crate) arguments_sha256: &'a str,
    pub(crate) rule: &'a str,
    pub(crate) rule_digest: &'a str,
}

/// The digest of everything an approval binds: length-prefixed parts, so
/// no two different calls share it.
pub(crate) fn binding(bound: &Bound<'_>) -> String {
    let mut hash = Sha256::new();
    for part in [
        bound.tenant,
        bound.subject,
        bound.tool,
        bound.server,
        bound.definition_hash,
        bound.arguments_sha256,
        bound.rule,
        bound.rule_digest,
    ] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    hex::encode(hash.finalize())
}

/// What differs between the call `bound` and the approval `details` of
/// `subject` (`None`: nothing), named for the worker.
pub(crate) fn difference(
    bound: &Bound<'_>,
    subject: &str,
    details: &Details,
) -> Option<&'static str> {
    if subject != bound.subject {
        Some("the subjects")
    } else if details.tool != bound.tool || details.server != bound.server {
        Some("the tools")
    } else if details.definition_hash != bound.definition_hash {
        Some("the tool's definitions")
    } else if details.arguments_sha256 != bound.arguments_sha256 {
        Some("the arguments")
    } else if details.rule != bound.rule || details.rule_digest != bound.rule_digest {
        Some("the policy rules that ask for approval")
    } else {
        None
    }
}

/// A new approval id: `apv_` and 16 random bytes (base64url).
fn new_id() -> String {
    use base64::Engine as _;
    let mut bytes = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .expect("the system's random source works");
    format!(
        "apv_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// An approval id as a caller gave it, checked: `apv_` and 22 base64url
/// characters.
fn well_formed(id: &str) -> bool {
    id.strip_prefix("apv_").is_some_and(|rest| {
        rest.len() == 22
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound() -> Bound<'static> {
        Bound {
            tenant: "acme",
            subject: "token:alice",
            tool: "pay__send",
            server: "pay",
            definition_hash: "d1",
            arguments_sha256: "a1",
            rule: "tenants[0].policy[0]",
            rule_digest: "r1",
        }
    }

    #[test]
    fn every_part_changes_the_binding() {
        let base = binding(&bound());
        let variants = [
            Bound {
                tenant: "other",
                ..bound()
            },
            Bound {
                subject: "token:bob",
                ..bound()
            },
            Bound {
                tool: "pay__refund",
                ..bound()
            },
            Bound {
                server: "pay2",
                ..bound()
            },
            Bound {
                definition_hash: "d2",
                ..bound()
            },
            Bound {
                arguments_sha256: "a2",
                ..bound()
            },
            Bound {
                rule: "tenants[0].policy[1]",
                ..bound()
            },
            Bound {
                rule_digest: "r2",
                ..bound()
            },
            // Parts are length-prefixed: moving a character between two
            // parts is another binding.
            Bound {
                tenant: "acm",
                subject: "etoken:alice",
                ..bound()
            },
        ];
        for variant in variants {
            assert_ne!(binding(&variant), base, "{variant:?}");
        }
        assert_eq!(binding(&bound()), base);
    }

    #[test]
    fn ids_are_random_and_checked() {
        let (a, b) = (new_id(), new_id());
        assert_ne!(a, b);
        assert!(well_formed(&a), "{a}");
        assert!(!well_formed("apv_short"));
        assert!(!well_formed(&a.replace("apv_", "tgt_")));
        assert!(!well_formed(&format!("{a}x")));
    }
}
