//! `completion/complete` on a live session: argument completion for a
//! prompt or a resource template, over [`Session::request`] (credentials,
//! timeout, trace context, cancellation as for any request), with the
//! answer bounded and redacted before it leaves the session.

use std::collections::HashMap;
use std::time::Duration;

use rmcp::model::{
    ArgumentInfo, ClientRequest, CompleteRequest, CompleteRequestParams, CompletionContext,
    CompletionInfo, Reference, ServerResult,
};

use super::{Request, Session, UpstreamError};
use crate::credentials::Redaction;

/// The most values a completion hands out (the MCP limit): values past it
/// are dropped and `has_more` set.
pub const MAX_COMPLETION_VALUES: usize = CompletionInfo::MAX_VALUES;

/// The longest completion value handed out, in bytes: a longer one is cut
/// (at a character boundary).
pub const MAX_COMPLETION_VALUE_BYTES: usize = 1024;

/// What a completion is about, in the server's own terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompletionRef {
    /// A prompt, by its name on the server.
    Prompt(String),
    /// A resource template, by its URI template.
    Template(String),
}

/// One `completion/complete` request.
#[derive(Debug, Clone)]
pub struct CompletionRequest {
    /// The prompt or template the argument belongs to.
    pub reference: CompletionRef,
    /// The argument's name.
    pub argument: String,
    /// What has been typed so far.
    pub value: String,
    /// The other arguments' values (none sent when empty).
    pub context: HashMap<String, String>,
}

/// The server's completion, bounded ([`MAX_COMPLETION_VALUES`],
/// [`MAX_COMPLETION_VALUE_BYTES`]) and redacted.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Completion {
    /// The values, best first.
    pub values: Vec<String>,
    /// How many values there are in all, when known.
    pub total: Option<u32>,
    /// Whether there are more values than those given.
    pub has_more: bool,
}

impl Session {
    /// Asks the server to complete `completion`'s argument within
    /// `timeout`, with the caller's trace context `inherited_trace` (sent
    /// when trace export is off). Values are redacted as results are when
    /// the server redacts results (`redact_results`), then bounded.
    ///
    /// # Errors
    /// What [`Session::request`] fails with, and a protocol error when the
    /// server answers something other than a completion.
    pub async fn complete(
        &self,
        completion: CompletionRequest,
        timeout: Duration,
        inherited_trace: Vec<(String, String)>,
    ) -> Result<Completion, UpstreamError> {
        let reference = match completion.reference {
            CompletionRef::Prompt(name) => Reference::for_prompt(name),
            CompletionRef::Template(uri_template) => Reference::for_resource(uri_template),
        };
        let mut params = CompleteRequestParams::new(
            reference,
            ArgumentInfo::new(completion.argument, completion.value),
        );
        if !completion.context.is_empty() {
            params = params.with_context(CompletionContext::with_arguments(completion.context));
        }
        let mut request = Request::new(
            ClientRequest::CompleteRequest(CompleteRequest::new(params)),
            timeout,
        );
        request.inherited_trace = inherited_trace;
        match self.request(&request).await? {
            ServerResult::CompleteResult(result) => {
                let redaction = self.redacts_results().then(|| self.redaction());
                Ok(bounded(result.completion, redaction))
            }
            _ => Err(UpstreamError::Protocol(
                "the server answered completion/complete with something other than a completion"
                    .to_owned(),
            )),
        }
    }
}

/// `info` redacted (when `redaction` is given) and bounded: at most
/// [`MAX_COMPLETION_VALUES`] values (more set `has_more`, and `total`
/// when the server gave none), each cut to [`MAX_COMPLETION_VALUE_BYTES`].
fn bounded(info: CompletionInfo, redaction: Option<&Redaction>) -> Completion {
    let CompletionInfo {
        mut values,
        total,
        has_more,
        ..
    } = info;
    let received = values.len();
    values.truncate(MAX_COMPLETION_VALUES);
    for value in &mut values {
        if let Some(redaction) = redaction {
            redaction.redact_in_place(value);
        }
        if value.len() > MAX_COMPLETION_VALUE_BYTES {
            let mut end = MAX_COMPLETION_VALUE_BYTES;
            while !value.is_char_boundary(end) {
                end -= 1;
            }
            value.truncate(end);
        }
    }
    let cut = received > values.len();
    Completion {
        values,
        total: total.or_else(|| cut.then(|| u32::try_from(received).unwrap_or(u32::MAX))),
        has_more: has_more.unwrap_or(false) || cut,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(values: Vec<String>, total: Option<u32>, has_more: Option<bool>) -> CompletionInfo {
        let mut info = CompletionInfo::new(Vec::new()).unwrap();
        info.values = values;
        info.total = total;
        info.has_more = has_more;
        info
    }

    #[test]
    fn values_are_bounded_in_count_and_size() {
        let many: Vec<String> = (0..150).map(|i| format!("v{i}")).collect();
        let got = bounded(info(many, None, None), None);
        assert_eq!(got.values.len(), MAX_COMPLETION_VALUES);
        assert_eq!(got.values[99], "v99");
        assert!(got.has_more);
        assert_eq!(got.total, Some(150));
        // The server's own total and has_more are kept.
        let got = bounded(info(vec!["a".into()], Some(7), Some(true)), None);
        assert_eq!((got.total, got.has_more), (Some(7), true));
        let got = bounded(info(vec!["a".into()], None, None), None);
        assert_eq!((got.total, got.has_more), (None, false));
        // A long value is cut at a character boundary within 1 KiB.
        let long = format!("{}é{}", "x".repeat(1023), "y".repeat(10));
        let got = bounded(info(vec![long, "short".into()], None, None), None);
        assert_eq!(got.values[0], "x".repeat(1023));
        assert_eq!(got.values[1], "short");
    }

    #[test]
    fn values_are_redacted_before_they_are_cut() {
        let redactor = crate::credentials::Redactor::new(["sekrit-token-value"]).shared();
        let redaction = Redaction::new(redactor);
        let at_the_cut = format!("{}sekrit-token-value", "x".repeat(1015));
        let got = bounded(
            info(
                vec!["use sekrit-token-value".into(), at_the_cut],
                None,
                None,
            ),
            Some(&redaction),
        );
        assert!(!got.values[0].contains("sekrit"), "{:?}", got.values[0]);
        assert!(!got.values[1].contains("sekrit"), "{:?}", got.values[1]);
    }
}
