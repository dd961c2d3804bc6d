//! The pipeline's idempotency step: a tool call that carries an
//! idempotency key claims it in the state store ("in flight", with the
//! digest of its arguments) before anything is sent, and its end records
//! the outcome ([`finish`]); a call whose key is already recorded is
//! answered from the record and never sent again.
//!
//! Scope: tenant × subject × exposed tool name × key (and, for a retry
//! that answers a round of questions, its `request_state`: each round is
//! a request of its own). What a later call with the key gets:
//!
//! | the key's record | the answer |
//! | --- | --- |
//! | done, same arguments | the recorded response, `replayed` set |
//! | done, the response over `idempotency.max_response_bytes` | `FAILED_PRECONDITION` / `CALL_ALREADY_DONE` |
//! | done with an error status | that status again (`replayed` in its metadata) |
//! | in flight | waits for the outcome within its deadline, else `ABORTED` / `CALL_IN_PROGRESS` |
//! | in doubt (`UNKNOWN`, or its gateway died) | `FAILED_PRECONDITION` / `CALL_IN_DOUBT` |
//! | other arguments | `INVALID_ARGUMENT` / `IDEMPOTENCY_KEY_REUSED` |

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub mod refusal;

pub use refusal::{KeyRefusal, RecordedStatus};

use super::{CallError, Origin, classify};
use crate::registry::limits::Admission;
use crate::state::idempotency::{Claimed, KeyRow, NewKey, key_hash, states};
use crate::state::{StateStore, now_ms};

/// The longest key accepted, in characters.
pub const MAX_KEY_LEN: usize = 255;

/// The metadata entry a key may be given in instead of the field.
pub const KEY_METADATA: &str = "idempotency-key";

/// What an in-flight claim adds to the call's longest run before its row
/// is in doubt (guards, the audit's place, the answer's way back).
const IN_FLIGHT_MARGIN: Duration = Duration::from_secs(60);

/// How often a call waiting for another's outcome looks again: first,
/// and at most.
const POLL_FIRST: Duration = Duration::from_millis(50);
const POLL_MAX: Duration = Duration::from_millis(500);

/// What a key's record keeps of its call's end (sealed in the row).
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Kept<T> {
    /// The result the caller got.
    Done { result: T },
    /// The call became this task.
    Task { task_id: String },
    /// The call completed; its result was larger than the bound.
    Large { bytes: usize },
    /// The call failed with this status (a definite failure).
    Failed {
        code: i32,
        reason: String,
        message: String,
    },
}

/// Checks a key: 1 to 255 visible ASCII characters.
///
/// # Errors
/// `IDEMPOTENCY_KEY_INVALID`.
pub fn check_key(key: &str) -> Result<(), KeyRefusal> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(KeyRefusal::Invalid("must be 1 to 255 characters"));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(KeyRefusal::Invalid(
            "must be visible ASCII characters (no spaces or control characters)",
        ));
    }
    Ok(())
}

/// The key of a request given as the field (`field`) and as metadata
/// (`metadata`): either, or both when they are equal.
///
/// # Errors
/// The two differ, or the metadata is not text.
pub fn request_key(field: String, metadata: Option<&[u8]>) -> Result<String, KeyRefusal> {
    let metadata = metadata
        .map(|value| {
            std::str::from_utf8(value)
                .map_err(|_| KeyRefusal::Invalid("the idempotency-key metadata is not ASCII"))
        })
        .transpose()?;
    match metadata {
        Some(value) if !field.is_empty() && value != field => Err(KeyRefusal::Invalid(
            "the request's idempotency_key and its idempotency-key metadata differ; give one, or both equal",
        )),
        Some(value) => Ok(value.to_owned()),
        None => Ok(field),
    }
}

/// A key this call claimed: the envelope records the call's end on it.
#[derive(Debug)]
pub(crate) struct Claim {
    store: StateStore,
    hash: String,
    tenant: String,
    /// The id of the call (in its record, and told to later calls).
    pub(crate) call_id: String,
    max_response_bytes: usize,
}

/// What the step decided.
pub(crate) enum Keyed<T> {
    /// The call runs under its claim.
    Run(Claim),
    /// The recorded result answers: nothing is sent.
    Replay {
        /// The result.
        result: T,
        /// The call that ran.
        call_id: String,
    },
}

/// The call that asks: what its key binds.
pub(crate) struct KeyedCall<'a> {
    /// The key.
    pub(crate) key: &'a str,
    /// The tool's exposed name.
    pub(crate) tool: &'a str,
    /// A retry's `request_state` (empty: the first round).
    pub(crate) request_state: &'a str,
    /// The digest of the arguments as the caller sent them.
    pub(crate) arguments_sha256: String,
    /// The longest the call may run before its row is in doubt.
    pub(crate) longest: Duration,
}

impl KeyedCall<'_> {
    /// The row key of the call's key for `origin`: its tenant, subject
    /// and tool, and a retry's round (its `request_state`'s digest).
    fn hash(&self, origin: &Origin) -> String {
        let scoped = if self.request_state.is_empty() {
            std::borrow::Cow::Borrowed(self.key)
        } else {
            use sha2::Digest as _;
            let round = hex::encode(sha2::Sha256::digest(self.request_state.as_bytes()));
            std::borrow::Cow::Owned(format!("{}\u{0}{round}", self.key))
        };
        key_hash(
            &origin.tenant.name,
            origin.subject.key(),
            self.tool,
            &scoped,
        )
    }
}

/// The idempotency step of `call` for `origin`. While it waits for
/// another call's outcome the call gives up its `admission` slot.
///
/// # Errors
/// A [`KeyRefusal`], a replayed failure ([`CallError::Replayed`]), the
/// caller's deadline while waiting (`CALL_IN_PROGRESS`).
pub(crate) async fn claim<T: DeserializeOwned>(
    store: Option<&StateStore>,
    origin: &Origin,
    call: &KeyedCall<'_>,
    metrics: &crate::telemetry::Metrics,
    admission: &mut Option<Admission>,
) -> Result<Keyed<T>, CallError> {
    let tenant = &origin.tenant;
    let counted = |outcome| metrics.idempotency().outcome(&tenant.name, outcome);
    let refused = |refusal: KeyRefusal| {
        counted(refusal.outcome());
        CallError::Keyed(refusal)
    };
    let Some(store) = store else {
        return Err(refused(KeyRefusal::StoreUnavailable {
            reason: "is not configured".to_owned(),
        }));
    };
    let unavailable = |e: crate::state::StateError| {
        tracing::warn!(error = %e, "idempotency key: state store unavailable");
        refused(KeyRefusal::StoreUnavailable {
            reason: "cannot be reached".to_owned(),
        })
    };
    let settings = tenant.idempotency();
    let hash = call.hash(origin);
    let call_id = new_call_id();
    let mut delay = POLL_FIRST;
    let mut waited = false;
    loop {
        let now = now_ms();
        let new = NewKey {
            key_hash: &hash,
            tenant: &tenant.name,
            arguments_sha256: &call.arguments_sha256,
            call_id: &call_id,
            in_flight_until_ms: now.saturating_add(millis(call.longest + IN_FLIGHT_MARGIN)),
            expires_at_ms: now.saturating_add(millis(settings.ttl)),
        };
        let row = match store
            .claim_key(&new, settings.max_keys)
            .await
            .map_err(unavailable)?
        {
            Claimed::Won => {
                if waited {
                    // The slot given up while waiting, taken again; a call
                    // shed now lets go of the key it just claimed.
                    match origin.admit().await {
                        Ok(slot) => *admission = Some(slot),
                        Err(shed) => {
                            if let Err(e) = store.release_key(&hash, &tenant.name, &call_id).await {
                                tracing::warn!(error = %e, "idempotency key: a shed call's key could not be let go; a retry will find it in doubt");
                            }
                            return Err(shed);
                        }
                    }
                }
                counted("claimed");
                return Ok(Keyed::Run(Claim {
                    store: store.clone(),
                    hash,
                    tenant: tenant.name.clone(),
                    call_id,
                    max_response_bytes: settings.max_response_bytes,
                }));
            }
            Claimed::Limit => {
                return Err(refused(KeyRefusal::Limit {
                    limit: settings.max_keys,
                }));
            }
            Claimed::Existing(row) => row,
        };
        let call_id_then = match judge(*row, call) {
            Judged::Answer(answer) => return counted_answer(answer, &counted),
            Judged::InFlight(call_id) => call_id,
        };
        // In flight at some replica: wait for its outcome, within this
        // call's deadline, without holding an admission slot.
        let left = origin
            .deadline
            .map(|d| d.saturating_sub(origin.started.elapsed()));
        if left.is_some_and(|left| left < delay) {
            return Err(refused(KeyRefusal::InProgress {
                call_id: call_id_then,
            }));
        }
        if !waited {
            waited = true;
            *admission = None;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(POLL_MAX);
    }
}

/// What a key's existing row says to a call with the key.
enum Judged<T> {
    /// The call is answered from the record (replayed or refused).
    Answer(Result<Keyed<T>, CallError>),
    /// The first call (this id) has not ended.
    InFlight(String),
}

fn judge<T: DeserializeOwned>(row: KeyRow, call: &KeyedCall<'_>) -> Judged<T> {
    if row.arguments_sha256 != call.arguments_sha256 {
        return Judged::Answer(Err(CallError::Keyed(KeyRefusal::Reused {
            call_id: row.call_id,
        })));
    }
    match row.state_now(now_ms()) {
        states::DONE => Judged::Answer(replay(row)),
        states::IN_FLIGHT => Judged::InFlight(row.call_id),
        _ => Judged::Answer(Err(CallError::Keyed(KeyRefusal::InDoubt {
            call_id: row.call_id,
        }))),
    }
}

/// Counts an answer from the record under its outcome.
fn counted_answer<T>(
    answer: Result<Keyed<T>, CallError>,
    counted: &impl Fn(&'static str),
) -> Result<Keyed<T>, CallError> {
    counted(match &answer {
        Err(CallError::Keyed(refusal)) => refusal.outcome(),
        _ => "replayed",
    });
    answer
}

/// The answer the key's record gives a call that cannot be routed now
/// (its server is down): a done call replays, one in doubt says so, other
/// arguments are refused. `None`: nothing recorded answers (no row, one
/// in flight, the store unreachable), and the call's own error stands.
pub(crate) async fn recorded<T: DeserializeOwned>(
    store: Option<&StateStore>,
    origin: &Origin,
    call: &KeyedCall<'_>,
    metrics: &crate::telemetry::Metrics,
) -> Option<Result<Keyed<T>, CallError>> {
    let row = store?
        .key(&call.hash(origin), &origin.tenant.name)
        .await
        .ok()??;
    match judge(row, call) {
        Judged::Answer(answer) => Some(counted_answer(answer, &|outcome| {
            metrics.idempotency().outcome(&origin.tenant.name, outcome);
        })),
        Judged::InFlight(_) => None,
    }
}

/// The answer a done row gives.
fn replay<T: DeserializeOwned>(row: KeyRow) -> Result<Keyed<T>, CallError> {
    let call_id = row.call_id;
    let Some(kept) = row.response else {
        return Err(CallError::Keyed(KeyRefusal::NotKept {
            call_id,
            why: if row.unreadable {
                "it was sealed with a key this gateway no longer has (state.keys)".to_owned()
            } else {
                "none was recorded".to_owned()
            },
            task_id: None,
        }));
    };
    let kept: Kept<T> = serde_json::from_slice(&kept).map_err(|e| {
        tracing::warn!(error = %e, "idempotency key: a recorded outcome does not read");
        CallError::Keyed(KeyRefusal::NotKept {
            call_id: call_id.clone(),
            why: "its record does not read as this version's".to_owned(),
            task_id: None,
        })
    })?;
    match kept {
        Kept::Done { result } => Ok(Keyed::Replay { result, call_id }),
        Kept::Task { task_id } => Err(CallError::Keyed(KeyRefusal::NotKept {
            call_id,
            why: format!("it became task {task_id}: follow it with GetTask"),
            task_id: Some(task_id),
        })),
        Kept::Large { bytes } => Err(CallError::Keyed(KeyRefusal::NotKept {
            call_id,
            why: format!("its {bytes} bytes are over idempotency.max_response_bytes"),
            task_id: None,
        })),
        Kept::Failed {
            code,
            reason,
            message,
        } => Err(CallError::Replayed(Box::new(RecordedStatus {
            code,
            reason,
            message,
            call_id,
        }))),
    }
}

/// What a call that holds a key ended with, for [`finish`].
pub(crate) enum Ended<'a> {
    /// A result the caller got: its record (see [`record_result`]).
    Answered(Vec<u8>),
    /// Questions for the caller: the call has not completed.
    Asked,
    /// An error.
    Failed(&'a CallError),
}

/// The record of `result`, the call's outcome, as a key keeps it.
pub(crate) fn record_result<T: Serialize>(result: &T) -> Vec<u8> {
    serde_json::to_vec(&Kept::Done { result }).unwrap_or_default()
}

/// The record of a call that became task `task_id`.
pub(crate) fn record_task(task_id: &str) -> Vec<u8> {
    serde_json::to_vec(&Kept::<()>::Task {
        task_id: task_id.to_owned(),
    })
    .unwrap_or_default()
}

/// Records the end of the call holding `claim`: a call that sent nothing
/// lets the key go (a retry runs it); a definite answer is kept (a
/// result within the bound, else its size; an error's status); a call
/// that may have acted without a definite answer is in doubt.
pub(crate) async fn finish(claim: Claim, sent: bool, ended: Ended<'_>) {
    let Claim {
        store,
        hash,
        tenant,
        call_id,
        max_response_bytes,
    } = claim;
    let kept = match ended {
        Ended::Failed(error) if !sent && classify(error).0 != tonic::Code::Unknown => None,
        Ended::Asked if !sent => None,
        // A round of questions is not the call's end: the answers' retry
        // is a request of its own (its key is scoped by its state).
        Ended::Asked => None,
        Ended::Answered(record) if record.len() > max_response_bytes => Some((
            states::DONE,
            Some(
                serde_json::to_vec(&Kept::<()>::Large {
                    bytes: record.len(),
                })
                .unwrap_or_default(),
            ),
        )),
        Ended::Answered(record) => Some((states::DONE, Some(record))),
        // UNKNOWN says the call may have acted, whatever else is known
        // (a session that closed mid-call may or may not have sent it).
        Ended::Failed(error) if classify(error).0 == tonic::Code::Unknown => {
            Some((states::IN_DOUBT, None))
        }
        Ended::Failed(error) => {
            let (code, reason) = classify(error);
            if may_have_acted(code) {
                Some((states::IN_DOUBT, None))
            } else {
                let message = crate::credentials::bounded(
                    &super::caller_message(error),
                    crate::credentials::MAX_STATUS_MESSAGE,
                );
                Some((
                    states::DONE,
                    Some(
                        serde_json::to_vec(&Kept::<()>::Failed {
                            code: code as i32,
                            reason: reason.to_owned(),
                            message,
                        })
                        .unwrap_or_default(),
                    ),
                ))
            }
        }
    };
    let done = match &kept {
        None => store.release_key(&hash, &tenant, &call_id).await,
        Some((state, record)) => {
            store
                .finish_key(&hash, &tenant, &call_id, state, record.as_deref())
                .await
        }
    };
    if let Err(e) = done {
        // The row stays in flight: a retry waits, then finds it in doubt
        // once its time is up. It is never run again unrecorded.
        tracing::warn!(
            error = %e,
            %call_id,
            "idempotency key: the call's outcome could not be recorded; a retry will find it in doubt"
        );
    }
}

/// Whether a call that failed with `code` after it was sent may have
/// acted without the caller knowing how: no definite answer came back.
fn may_have_acted(code: tonic::Code) -> bool {
    use tonic::Code;
    matches!(
        code,
        Code::Unknown
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Unavailable
            | Code::Aborted
            | Code::Internal
            | Code::DataLoss
    )
}

/// How often expired keys are purged.
const PURGE_EVERY: Duration = Duration::from_secs(60);

/// Purges expired keys of every tenant every minute until `stop` (a key
/// claimed again after its ttl has its old row purged by the claim), once
/// this process has used the store.
pub async fn purge_until(store: StateStore, stop: tokio_util::sync::CancellationToken) {
    let mut ticks = tokio::time::interval(PURGE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        match store.purge_expired_keys().await {
            Ok(0) => {}
            Ok(purged) => tracing::debug!(purged, "expired idempotency keys purged"),
            Err(e) => tracing::debug!(error = %e, "idempotency keys: purge skipped"),
        }
    }
}

/// A new call id: 128 random bits, hex.
fn new_call_id() -> String {
    format!("{:032x}", fastrand::u128(..))
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked_and_the_field_and_metadata_agree() {
        assert!(check_key("order-42").is_ok());
        assert!(check_key("").is_err());
        assert!(check_key("has space").is_err());
        assert!(check_key(&"k".repeat(256)).is_err());
        assert_eq!(request_key("a".into(), None).unwrap(), "a");
        assert_eq!(request_key(String::new(), Some(b"m")).unwrap(), "m");
        assert_eq!(request_key("m".into(), Some(b"m")).unwrap(), "m");
        assert!(request_key("a".into(), Some(b"b")).is_err());
    }

    #[test]
    fn a_recorded_reason_reads_back_as_itself() {
        let status = RecordedStatus {
            code: 9,
            reason: "GUARD_DENIED".to_owned(),
            message: "m".to_owned(),
            call_id: "c".to_owned(),
        };
        assert_eq!(status.reason(), "GUARD_DENIED");
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    }

    fn done(kept: Vec<u8>) -> KeyRow {
        KeyRow {
            arguments_sha256: "a".to_owned(),
            state: states::DONE.to_owned(),
            call_id: "c1".to_owned(),
            in_flight_until_ms: 0,
            expires_at_ms: i64::MAX,
            response: Some(kept),
            unreadable: false,
        }
    }

    #[test]
    fn each_kind_of_record_answers_as_documented() {
        let result = serde_json::json!({"content": []});
        match replay::<serde_json::Value>(done(record_result(&result))) {
            Ok(Keyed::Replay {
                result: got,
                call_id,
            }) => {
                assert_eq!((got, call_id.as_str()), (result, "c1"));
            }
            _ => panic!("a result replays"),
        }
        match replay::<serde_json::Value>(done(record_task("tgt_1"))) {
            Err(CallError::Keyed(KeyRefusal::NotKept { task_id, .. })) => {
                assert_eq!(task_id.as_deref(), Some("tgt_1"));
            }
            _ => panic!("a task is named"),
        }
        let failed = serde_json::to_vec(&Kept::<()>::Failed {
            code: 7,
            reason: "GUARD_DENIED".to_owned(),
            message: "no".to_owned(),
        })
        .unwrap();
        match replay::<serde_json::Value>(done(failed)) {
            Err(CallError::Replayed(status)) => {
                assert_eq!(
                    classify(&CallError::Replayed(status.clone())),
                    (tonic::Code::PermissionDenied, "GUARD_DENIED")
                );
                assert_eq!(status.call_id, "c1");
            }
            _ => panic!("a failure answers again"),
        }
        let mut unreadable = done(Vec::new());
        unreadable.response = None;
        unreadable.unreadable = true;
        match replay::<serde_json::Value>(unreadable) {
            Err(CallError::Keyed(KeyRefusal::NotKept { why, .. })) => {
                assert!(why.contains("state.keys"))
            }
            _ => panic!("an unreadable record is never taken for none"),
        }
    }

    #[test]
    fn only_answers_without_a_definite_outcome_are_in_doubt() {
        assert!(may_have_acted(tonic::Code::Unknown));
        assert!(may_have_acted(tonic::Code::DeadlineExceeded));
        assert!(!may_have_acted(tonic::Code::InvalidArgument));
        assert!(!may_have_acted(tonic::Code::PermissionDenied));
        assert!(!may_have_acted(tonic::Code::ResourceExhausted));
    }
}
