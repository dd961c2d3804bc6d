//! Which call a server's question belongs to, on sessions where the
//! server asks while a `tools/call` is pending (protocol 2025-11-25 and
//! earlier: `elicitation/create`, `sampling/createMessage`).
//!
//! Every `tools/call` registers before it is sent (so "exactly one call in
//! flight" is exact) with the kinds of question its worker answers and,
//! for `InvokeToolInteractive`, where questions go; it is keyed by its
//! request id once the send returns. A server's request is tied, in this
//! order, by (1) the HTTP response stream it arrived on
//! ([`InboundStreamOrigin::OutboundRequest`]), (2) exactly one call in
//! flight on the session. Anything else is refused: never guessed.
//!
//! A `progressToken` in the `_meta` of the server's request names nothing
//! here: a request's progress token belongs to the side that sent the
//! request, so the server's token on its `elicitation/create` is the
//! server's own (rmcp servers number every request they send), and may
//! equal the token of an unrelated call of ours.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::RequestId;
use rmcp::service::InboundStreamOrigin;
use tokio::sync::{Notify, oneshot};

use super::input::{Answer, Asked, InputKinds, InputSink, QuestionKind, Round};

/// How long a server request that names a call not keyed yet (its send
/// has not returned) waits for it.
const TIE_WAIT: Duration = Duration::from_secs(2);

/// The calls in flight on one session.
#[derive(Debug, Clone, Default)]
pub(super) struct Ties {
    calls: Arc<Mutex<Calls>>,
    /// Woken whenever a call registers, is keyed or ends.
    changed: Arc<Notify>,
}

#[derive(Debug, Default)]
struct Calls {
    next: u64,
    entries: HashMap<u64, Entry>,
}

#[derive(Debug)]
struct Entry {
    /// Set once the send returned.
    request_id: Option<RequestId>,
    accepts: InputKinds,
    asker: Option<InputSink>,
    /// Questions asked so far (their ids are `q1`, `q2`, ...).
    asked: u32,
    /// Time spent waiting for the worker's answers, which pauses the
    /// call's upstream timeout: the questions waiting now, since when, and
    /// the time of those answered.
    waiting: u32,
    waiting_since: Option<std::time::Instant>,
    paused: Duration,
    /// Ends the call early (taken once).
    interrupt: Option<oneshot::Sender<Interrupt>>,
}

/// Why a call was ended by one of its questions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Interrupt {
    /// The worker opted in to this kind but can answer only over
    /// `InvokeToolInteractive`.
    NeedsInteractive(QuestionKind),
    /// The worker did not answer within `input.answer_timeout`.
    AnswerTimeout(Duration),
    /// The server asked more than `input.max_rounds` questions.
    RoundsExceeded(u32),
}

impl From<Interrupt> for super::UpstreamError {
    fn from(interrupt: Interrupt) -> Self {
        match interrupt {
            Interrupt::NeedsInteractive(kind) => Self::InputRequiresInteractive(kind),
            Interrupt::AnswerTimeout(after) => Self::InputAnswerTimeout(after),
            Interrupt::RoundsExceeded(max) => Self::InputRoundsExceeded(max),
        }
    }
}

/// One call's place in [`Ties`]; dropping it removes the call.
#[derive(Debug)]
pub(super) struct Registration {
    ties: Ties,
    key: u64,
    interrupt: Option<oneshot::Receiver<Interrupt>>,
}

impl Registration {
    /// Records the request id of the sent call.
    pub(super) fn keyed(&self, id: RequestId) {
        {
            let mut calls = self.ties.calls.lock().expect("ties lock");
            if let Some(entry) = calls.entries.get_mut(&self.key) {
                entry.request_id = Some(id);
            }
        }
        self.ties.changed.notify_waiters();
    }

    /// The clock of the time the call waits for its worker's answers.
    pub(super) fn waited(&self) -> Waited {
        Waited {
            ties: self.ties.clone(),
            key: self.key,
        }
    }

    /// Resolves when a question ended the call (never otherwise).
    pub(super) async fn interrupted(&mut self) -> Interrupt {
        match self.interrupt.take() {
            Some(receiver) => match receiver.await {
                Ok(interrupt) => interrupt,
                Err(_) => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.ties
            .calls
            .lock()
            .expect("ties lock")
            .entries
            .remove(&self.key);
        self.ties.changed.notify_waiters();
    }
}

/// How long one call has waited for its worker's answers.
#[derive(Debug)]
pub(super) struct Waited {
    ties: Ties,
    key: u64,
}

impl Waited {
    /// The time waited so far (a wait going on included).
    pub(super) fn so_far(&self) -> Duration {
        let calls = self.ties.calls.lock().expect("ties lock");
        calls.entries.get(&self.key).map_or(Duration::ZERO, |e| {
            e.paused
                + e.waiting_since
                    .map_or(Duration::ZERO, |since| since.elapsed())
        })
    }
}

/// A call waiting for its worker's answers; dropping it ends the wait.
#[derive(Debug)]
pub(super) struct Waiting {
    ties: Ties,
    key: u64,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut calls = self.ties.calls.lock().expect("ties lock");
        if let Some(entry) = calls.entries.get_mut(&self.key) {
            entry.waiting = entry.waiting.saturating_sub(1);
            if entry.waiting == 0
                && let Some(since) = entry.waiting_since.take()
            {
                entry.paused += since.elapsed();
            }
        }
    }
}

/// A server request tied to a call.
#[derive(Debug)]
pub(super) struct Tied {
    /// The call's key in [`Ties`].
    pub(super) key: u64,
    /// What its worker answers.
    pub(super) accepts: InputKinds,
    /// Where its questions go (`InvokeToolInteractive` only).
    pub(super) asker: Option<InputSink>,
    /// The id of this question for the worker (`q<n>`).
    pub(super) id: String,
    /// How many questions the call has been asked, this one included.
    pub(super) number: u32,
}

/// A server request no call could be tied to.
#[derive(Debug, Clone, Copy)]
pub(super) struct Untied {
    /// Calls in flight on the session when it was refused.
    pub(super) in_flight: usize,
}

/// What the rules say of a request, now.
enum Decision {
    Tied(u64),
    /// A call it may name is not keyed yet.
    Wait,
    Refuse,
}

impl Ties {
    /// Registers a call about to be sent.
    pub(super) fn register(&self, accepts: InputKinds, asker: Option<InputSink>) -> Registration {
        let (sender, receiver) = oneshot::channel();
        let key = {
            let mut calls = self.calls.lock().expect("ties lock");
            calls.next += 1;
            let key = calls.next;
            calls.entries.insert(
                key,
                Entry {
                    request_id: None,
                    accepts,
                    asker,
                    asked: 0,
                    waiting: 0,
                    waiting_since: None,
                    paused: Duration::ZERO,
                    interrupt: Some(sender),
                },
            );
            key
        };
        self.changed.notify_waiters();
        Registration {
            ties: self.clone(),
            key,
            interrupt: Some(receiver),
        }
    }

    /// Calls in flight on the session.
    pub(super) fn in_flight(&self) -> usize {
        self.calls.lock().expect("ties lock").entries.len()
    }

    /// The call a server request belongs to, by the rules of the module
    /// documentation; waits at most [`TIE_WAIT`] for a call that is not
    /// keyed yet.
    pub(super) async fn tie(&self, origin: Option<&InboundStreamOrigin>) -> Result<Tied, Untied> {
        let deadline = tokio::time::Instant::now() + TIE_WAIT;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut calls = self.calls.lock().expect("ties lock");
                match decide(&calls, origin) {
                    Decision::Tied(key) => {
                        let entry = calls.entries.get_mut(&key).expect("decided on an entry");
                        entry.asked += 1;
                        return Ok(Tied {
                            key,
                            accepts: entry.accepts,
                            asker: entry.asker.clone(),
                            id: format!("q{}", entry.asked),
                            number: entry.asked,
                        });
                    }
                    Decision::Refuse => {
                        return Err(Untied {
                            in_flight: calls.entries.len(),
                        });
                    }
                    Decision::Wait => {}
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(Untied {
                    in_flight: self.in_flight(),
                });
            }
        }
    }

    /// Marks call `key` waiting for its worker until the guard drops.
    pub(super) fn waiting(&self, key: u64) -> Waiting {
        if let Some(entry) = self.calls.lock().expect("ties lock").entries.get_mut(&key) {
            entry.waiting += 1;
            entry
                .waiting_since
                .get_or_insert_with(std::time::Instant::now);
        }
        Waiting {
            ties: self.clone(),
            key,
        }
    }

    /// Ends call `key` early with `interrupt` (once).
    pub(super) fn interrupt(&self, key: u64, interrupt: Interrupt) {
        let sender = self
            .calls
            .lock()
            .expect("ties lock")
            .entries
            .get_mut(&key)
            .and_then(|entry| entry.interrupt.take());
        if let Some(sender) = sender {
            let _ = sender.send(interrupt);
        }
    }

    /// Resolves once call `key` is no longer in flight.
    pub(super) async fn ended(&self, key: u64) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !self
                .calls
                .lock()
                .expect("ties lock")
                .entries
                .contains_key(&key)
            {
                return;
            }
            changed.await;
        }
    }
}

fn decide(calls: &Calls, origin: Option<&InboundStreamOrigin>) -> Decision {
    // (1) The POST response stream it arrived on names the call.
    if let Some(InboundStreamOrigin::OutboundRequest(id)) = origin {
        let found = calls
            .entries
            .iter()
            .find(|(_, e)| e.request_id.as_ref() == Some(id))
            .map(|(k, _)| *k);
        let pending = calls.entries.values().any(|e| e.request_id.is_none());
        return match found {
            Some(key) => Decision::Tied(key),
            None if pending => Decision::Wait,
            None => Decision::Refuse,
        };
    }
    // The server sent it on its standalone stream: it is no call's.
    if matches!(origin, Some(InboundStreamOrigin::Unassociated)) {
        return Decision::Refuse;
    }
    // (2) Exactly one call in flight (whatever progress token the
    // server's request carries: that token is the server's own).
    let mut keys = calls.entries.keys();
    match (keys.next(), keys.next()) {
        (Some(key), None) => Decision::Tied(*key),
        _ => Decision::Refuse,
    }
}

/// Runs `future` for at most `timeout`, not counting the time the call
/// waits for its worker's answers (the caller's own deadline is
/// kept by the RPC: `InvokeToolInteractive` ends the call at it).
///
/// # Errors
/// The time ran out.
pub(super) async fn within<F: std::future::Future>(
    timeout: Duration,
    waited: &Waited,
    future: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    let started = tokio::time::Instant::now();
    tokio::pin!(future);
    loop {
        let deadline = started + timeout + waited.so_far();
        match tokio::time::timeout_at(deadline, &mut future).await {
            Ok(output) => return Ok(output),
            Err(elapsed) if started + timeout + waited.so_far() <= deadline => return Err(elapsed),
            // The worker was asked meanwhile: the deadline moved.
            Err(_) => {}
        }
    }
}

/// Why a worker gave no answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unanswered {
    /// Not within the time allowed.
    Timeout,
    /// The worker went away (its stream closed).
    Gone,
}

/// Puts `asked` to the worker behind `asker` and waits at most `timeout`
/// for its answers.
pub(super) async fn ask(
    asker: &InputSink,
    asked: Vec<Asked>,
    timeout: Duration,
) -> Result<Vec<Answer>, Unanswered> {
    let (reply, answered) = oneshot::channel();
    let round = async {
        asker
            .send(Round { asked, reply })
            .await
            .map_err(|_| Unanswered::Gone)?;
        answered.await.map_err(|_| Unanswered::Gone)
    };
    tokio::time::timeout(timeout, round)
        .await
        .map_err(|_| Unanswered::Timeout)?
}

/// The size of a question as bounded: its message and its schema or
/// params as JSON.
pub(super) fn question_bytes(question: &super::input::Question) -> usize {
    use super::input::Question;
    match question {
        Question::Form { message, schema } => message.len() + schema.to_string().len(),
        Question::Url { message, url, .. } => message.len() + url.len(),
        Question::Sampling { params } => params.to_string().len(),
    }
}

/// The most bytes one question may have ([`question_bytes`]).
pub(super) const MAX_QUESTION_BYTES: usize = 64 * 1024;

#[cfg(test)]
mod tests {
    use rmcp::model::NumberOrString;

    use super::*;

    fn id(n: i64) -> RequestId {
        NumberOrString::Number(n)
    }

    #[tokio::test]
    async fn one_call_in_flight_takes_an_unnamed_request() {
        let ties = Ties::default();
        let call = ties.register(InputKinds::default(), None);
        let tied = ties.tie(None).await.expect("the only call");
        assert_eq!(tied.key, call.key);
        assert_eq!(tied.id, "q1");
        assert_eq!(ties.tie(None).await.unwrap().id, "q2");
        drop(call);
        assert_eq!(ties.tie(None).await.unwrap_err().in_flight, 0);
    }

    #[tokio::test]
    async fn two_calls_need_a_name() {
        let ties = Ties::default();
        let first = ties.register(InputKinds::default(), None);
        let second = ties.register(InputKinds::default(), None);
        first.keyed(id(1));
        second.keyed(id(2));
        assert_eq!(ties.tie(None).await.unwrap_err().in_flight, 2);
        let by_stream = ties
            .tie(Some(&InboundStreamOrigin::OutboundRequest(id(2))))
            .await
            .unwrap();
        assert_eq!(by_stream.key, second.key);
        // A stream that is no call's is refused, never given to another.
        assert!(
            ties.tie(Some(&InboundStreamOrigin::OutboundRequest(id(3))))
                .await
                .is_err()
        );
        assert!(
            ties.tie(Some(&InboundStreamOrigin::Unassociated))
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn a_request_naming_a_call_not_keyed_yet_waits_for_it() {
        let ties = Ties::default();
        let call = ties.register(InputKinds::default(), None);
        let _other = {
            let other = ties.register(InputKinds::default(), None);
            other.keyed(id(9));
            other
        };
        let waiting = {
            let ties = ties.clone();
            tokio::spawn(async move {
                ties.tie(Some(&InboundStreamOrigin::OutboundRequest(id(1))))
                    .await
                    .map(|t| t.key)
            })
        };
        tokio::task::yield_now().await;
        call.keyed(id(1));
        assert_eq!(waiting.await.unwrap().unwrap(), call.key);
    }

    #[tokio::test]
    async fn an_interrupt_ends_the_call_and_is_seen_once() {
        let ties = Ties::default();
        let mut call = ties.register(InputKinds::default(), None);
        let key = call.key;
        ties.interrupt(key, Interrupt::NeedsInteractive(QuestionKind::Form));
        ties.interrupt(key, Interrupt::AnswerTimeout(Duration::from_secs(1)));
        assert_eq!(
            call.interrupted().await,
            Interrupt::NeedsInteractive(QuestionKind::Form)
        );
        let ended = {
            let ties = ties.clone();
            tokio::spawn(async move { ties.ended(key).await })
        };
        drop(call);
        tokio::time::timeout(Duration::from_secs(5), ended)
            .await
            .expect("ended")
            .unwrap();
    }
}
