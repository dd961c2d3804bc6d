//! Webhook notifications of call approvals: when a call is held for
//! approval, a signed JSON [`Summary`] is POSTed to the tenant's
//! `call_approvals.webhook` in the background ([`Notifier::notify`]), with
//! retries, under the address rule of the servers of tenants the operator
//! did not write (`upstream_allow`). The receiver's side is in
//! `docs/call-approvals.md`, "Notifications".

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::sync::Semaphore;

use crate::config::WebhookConfig;
use crate::config::address::UpstreamAllow;

/// The `event` of a [`Summary`] sent when a call approval is requested.
pub(crate) const REQUESTED: &str = "call_approval.requested";

/// The header with the delivery's signature: `t=<unix seconds>,v1=<hex>`.
pub(crate) const SIGNATURE_HEADER: &str = "toolgate-signature";

/// The header with the delivery's id, the same on every attempt.
pub(crate) const DELIVERY_HEADER: &str = "toolgate-delivery";

/// Deliveries in flight in this process at most; beyond, a new one is
/// dropped (with a warning).
const MAX_IN_FLIGHT: usize = 256;

/// The wait after the first failed attempt; doubled after each further
/// one.
const BACKOFF_BASE: Duration = Duration::from_millis(500);

/// The longest wait between two attempts (a `Retry-After` included).
const BACKOFF_CAP: Duration = Duration::from_secs(30);

/// What a webhook receives when a call approval is requested (JSON body).
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Summary {
    /// [`REQUESTED`].
    pub(crate) event: &'static str,
    /// The approval's id.
    pub(crate) approval_id: String,
    /// The tenant's name.
    pub(crate) tenant: String,
    /// The tool's exposed name (`server__tool`).
    pub(crate) tool: String,
    /// The tool's server.
    pub(crate) server: String,
    /// The subject key of the requester (`""`: the tenant itself).
    pub(crate) subject: String,
    /// The policy rule that asked for approval (`tenants[0].policy[2]`).
    pub(crate) rule: String,
    /// The call's arguments, already redacted by the caller.
    pub(crate) arguments_json: String,
    /// The SHA-256 of the call's arguments, lowercase hex.
    pub(crate) arguments_sha256: String,
    /// When the approval was requested (Unix milliseconds).
    pub(crate) created_at_unix_ms: i64,
    /// When it expires undecided (Unix milliseconds).
    pub(crate) expires_at_unix_ms: i64,
}

/// Sends [`Summary`]s to webhooks: one per process, shared by every
/// tenant (it bounds the deliveries in flight).
#[derive(Debug, Clone)]
pub(crate) struct Notifier {
    /// `upstream_allow`: what a webhook may reach besides public addresses.
    allow: Arc<UpstreamAllow>,
    /// Permits of the deliveries in flight.
    in_flight: Arc<Semaphore>,
    /// The waits between attempts.
    backoff: Backoff,
}

/// Exponential backoff from `base`, capped at `cap`.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    base: Duration,
    cap: Duration,
}

impl Backoff {
    /// The wait after `failed` failed attempts (at least 1): `base`
    /// doubled `failed - 1` times, or what the receiver's `Retry-After`
    /// asked; at most `cap`.
    fn wait(self, failed: u32, retry_after: Option<Duration>) -> Duration {
        let exponential = self
            .base
            .saturating_mul(1 << failed.saturating_sub(1).min(16));
        retry_after.unwrap_or(exponential).min(self.cap)
    }
}

/// How one delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// A 2xx answer, at this attempt.
    Delivered { attempts: u32 },
    /// No 2xx answer: after `attempts` attempts (0 when nothing was sent),
    /// for `reason`.
    GaveUp { attempts: u32, reason: String },
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Delivered { .. } => f.write_str("delivered"),
            Outcome::GaveUp { attempts, reason } => {
                write!(f, "gave up after {attempts} attempts: {reason}")
            }
        }
    }
}

/// What one attempt got.
enum Attempt {
    Delivered,
    /// Worth another attempt (a connection error, a timeout, 5xx, 429).
    Retry {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// Not worth another (a 3xx or 4xx answer).
    Stop(String),
    /// Nothing was sent: the address rule refused the destination, or no
    /// client could be built.
    NotSent(String),
}

impl Notifier {
    /// A notifier whose deliveries reach public addresses and what
    /// `upstream_allow` allows (a receiver on loopback or a private
    /// network needs an entry there).
    pub(crate) fn new(upstream_allow: Arc<UpstreamAllow>) -> Self {
        Self {
            allow: upstream_allow,
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            backoff: Backoff {
                base: BACKOFF_BASE,
                cap: BACKOFF_CAP,
            },
        }
    }

    /// Delivers `summary` to `webhook` in the background (never blocks the
    /// call): returns at once. With [`MAX_IN_FLIGHT`] deliveries in flight
    /// already, drops it with a warning. Call within a Tokio runtime.
    pub(crate) fn notify(&self, webhook: &WebhookConfig, summary: Summary) {
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            tracing::warn!(
                tenant = %summary.tenant,
                approval_id = %summary.approval_id,
                host = %webhook.host_for_logs(),
                outcome = "dropped",
                "call approval webhook: {MAX_IN_FLIGHT} deliveries in flight already; not sent"
            );
            return;
        };
        let (notifier, webhook) = (self.clone(), webhook.clone());
        tokio::spawn(async move {
            notifier.deliver(&webhook, &summary).await;
            drop(permit);
        });
    }

    /// Delivers `summary` to `webhook`, logging how it ended.
    async fn deliver(&self, webhook: &WebhookConfig, summary: &Summary) -> Outcome {
        let outcome = self.attempts(webhook, summary).await;
        let host = webhook.host_for_logs();
        match &outcome {
            Outcome::Delivered { attempts } => tracing::info!(
                tenant = %summary.tenant,
                approval_id = %summary.approval_id,
                host = %host,
                attempts,
                outcome = %outcome,
                "call approval webhook"
            ),
            Outcome::GaveUp { attempts, .. } => tracing::warn!(
                tenant = %summary.tenant,
                approval_id = %summary.approval_id,
                host = %host,
                attempts,
                outcome = %outcome,
                "call approval webhook"
            ),
        }
        outcome
    }

    /// Up to `webhook.attempts` attempts, the same body and delivery id
    /// each time (signed anew with its own time).
    async fn attempts(&self, webhook: &WebhookConfig, summary: &Summary) -> Outcome {
        let body = match serde_json::to_vec(summary) {
            Ok(body) => body,
            Err(e) => {
                return Outcome::GaveUp {
                    attempts: 0,
                    reason: format!("cannot encode the summary: {e}"),
                };
            }
        };
        let delivery = format!("{:032x}", fastrand::u128(..));
        let mut failed = 0;
        loop {
            let reason = match self.attempt(webhook, &body, &delivery).await {
                Attempt::Delivered => {
                    return Outcome::Delivered {
                        attempts: failed + 1,
                    };
                }
                Attempt::Stop(reason) => {
                    return Outcome::GaveUp {
                        attempts: failed + 1,
                        reason,
                    };
                }
                Attempt::NotSent(reason) => {
                    return Outcome::GaveUp {
                        attempts: failed,
                        reason: format!("not sent: {reason}"),
                    };
                }
                Attempt::Retry {
                    reason,
                    retry_after,
                } => {
                    failed += 1;
                    if failed >= webhook.attempts {
                        reason
                    } else {
                        tokio::time::sleep(self.backoff.wait(failed, retry_after)).await;
                        continue;
                    }
                }
            };
            return Outcome::GaveUp {
                attempts: failed,
                reason,
            };
        }
    }

    /// One POST of `body`, checked against the address rule first.
    async fn attempt(&self, webhook: &WebhookConfig, body: &[u8], delivery: &str) -> Attempt {
        let client = match crate::upstream::webhook_client(&webhook.url, &self.allow).await {
            Ok(client) => client,
            Err(reason) => return Attempt::NotSent(reason),
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let mut signature = http::HeaderValue::from_str(&signature(&webhook.secret, now, body))
            .expect("ASCII digits and hex");
        signature.set_sensitive(true);
        let sent = client
            .post(webhook.url.clone())
            .timeout(webhook.timeout)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, signature)
            .header(DELIVERY_HEADER, delivery)
            .body(body.to_vec())
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(e) if e.is_timeout() => {
                return Attempt::Retry {
                    reason: format!(
                        "no answer within {}",
                        humantime::format_duration(webhook.timeout)
                    ),
                    retry_after: None,
                };
            }
            Err(e) => {
                return Attempt::Retry {
                    reason: cause(&e.without_url()),
                    retry_after: None,
                };
            }
        };
        let status = response.status();
        if status.is_success() {
            return Attempt::Delivered;
        }
        let reason = format!("HTTP {status}");
        if status.is_server_error() || status == http::StatusCode::TOO_MANY_REQUESTS {
            let retry_after = response
                .headers()
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            return Attempt::Retry {
                reason,
                retry_after,
            };
        }
        if status.is_redirection() {
            return Attempt::Stop(format!("{reason} (redirects are not followed)"));
        }
        Attempt::Stop(format!("{reason} (not retried)"))
    }
}

/// `t=<now>,v1=<lowercase hex HMAC-SHA256(secret, "<now>.<body>")>`.
fn signature(secret: &crate::config::Secret, now: u64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.expose().as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(now.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("t={now},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// The innermost cause of a failed request (it names no URL).
fn cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut current = error;
    while let Some(source) = current.source() {
        current = source;
    }
    current.to_string()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;
    use std::sync::Mutex;

    use axum::http::{HeaderMap, StatusCode};
    use tokio::sync::mpsc;

    use super::*;
    use crate::config::Secret;

    const SECRET: &str = "webhook-secret-0123456789";

    /// One test of this module at a time: a log line's callsite first hit
    /// on another test's thread while a subscriber is being set up can be
    /// cached as uninteresting, and the log test would miss it.
    async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
        static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        SERIAL.lock().await
    }

    /// One request the receiver got.
    #[derive(Debug)]
    struct Received {
        signature: String,
        delivery: String,
        content_type: String,
        body: Vec<u8>,
    }

    /// A receiver on 127.0.0.1 answering each request with the next of
    /// `answers` (then 200), at `/hook`.
    async fn receiver(
        answers: Vec<(StatusCode, Vec<(&'static str, String)>)>,
    ) -> (u16, mpsc::UnboundedReceiver<Received>) {
        let answers = Arc::new(Mutex::new(answers.into_iter()));
        let (tx, rx) = mpsc::unbounded_channel();
        let handler = move |headers: HeaderMap, body: axum::body::Bytes| {
            let (answers, tx) = (answers.clone(), tx.clone());
            async move {
                let header = |name: &str| {
                    headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned()
                };
                let _ = tx.send(Received {
                    signature: header(SIGNATURE_HEADER),
                    delivery: header(DELIVERY_HEADER),
                    content_type: header("content-type"),
                    body: body.to_vec(),
                });
                let (status, extra) = answers
                    .lock()
                    .unwrap()
                    .next()
                    .unwrap_or((StatusCode::OK, Vec::new()));
                let mut response = axum::response::Response::new(axum::body::Body::empty());
                *response.status_mut() = status;
                for (name, value) in extra {
                    response
                        .headers_mut()
                        .insert(name, value.parse().expect("a header value"));
                }
                response
            }
        };
        let router = axum::Router::new().route("/hook", axum::routing::post(handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, router).await });
        (port, rx)
    }

    /// `upstream_allow` as validated from `entries`.
    fn allow(entries: &str) -> Arc<UpstreamAllow> {
        let yaml = format!("upstream_allow: {entries}\ntenants: [{{name: t, tokens: [tok]}}]\n");
        crate::config::Config::from_yaml(
            &yaml,
            "test.yaml",
            Path::new("."),
            &HashMap::<String, String>::new(),
        )
        .expect("a valid configuration")
        .upstream_allow
    }

    /// A notifier that may reach 127.0.0.1, with millisecond backoffs.
    fn notifier() -> Notifier {
        let mut notifier = Notifier::new(allow("[\"127.0.0.1\"]"));
        notifier.backoff = Backoff {
            base: Duration::from_millis(1),
            cap: Duration::from_millis(20),
        };
        notifier
    }

    fn webhook(port: u16, attempts: u32) -> WebhookConfig {
        WebhookConfig {
            url: format!("http://127.0.0.1:{port}/hook?token=in-the-query")
                .parse()
                .unwrap(),
            secret: Secret::new(SECRET),
            timeout: Duration::from_secs(5),
            attempts,
        }
    }

    fn summary() -> Summary {
        Summary {
            event: REQUESTED,
            approval_id: "apr_1".to_owned(),
            tenant: "acme".to_owned(),
            tool: "repo__delete".to_owned(),
            server: "repo".to_owned(),
            subject: "token:alice".to_owned(),
            rule: "tenants[0].policy[2]".to_owned(),
            arguments_json: "{\"path\":\"/tmp\"}".to_owned(),
            arguments_sha256: "00".repeat(32),
            created_at_unix_ms: 1,
            expires_at_unix_ms: 2,
        }
    }

    /// The receiver's check, written apart from [`signature`]: the HMAC of
    /// `t.body` under the secret, compared in constant time, and `t`
    /// within five minutes of now.
    fn verify(header: &str, body: &[u8]) -> bool {
        let mut t = None;
        let mut v1 = None;
        for part in header.split(',') {
            match part.split_once('=') {
                Some(("t", value)) => t = value.parse::<u64>().ok(),
                Some(("v1", value)) => v1 = hex::decode(value).ok(),
                _ => {}
            }
        }
        let (Some(t), Some(v1)) = (t, v1) else {
            return false;
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        if now.abs_diff(t) > 300 {
            return false;
        }
        let mut signed = format!("{t}.").into_bytes();
        signed.extend_from_slice(body);
        let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
        mac.update(&signed);
        mac.verify_slice(&v1).is_ok()
    }

    #[tokio::test]
    async fn a_delivery_is_signed_and_retried_after_a_5xx_with_the_same_id() {
        let _serial = serial().await;
        let (port, mut rx) = receiver(vec![(StatusCode::INTERNAL_SERVER_ERROR, Vec::new())]).await;
        let outcome = notifier().deliver(&webhook(port, 3), &summary()).await;
        assert_eq!(outcome, Outcome::Delivered { attempts: 2 });
        let first = rx.recv().await.unwrap();
        let second = rx.recv().await.unwrap();
        assert!(rx.try_recv().is_err(), "delivered once after the retry");
        assert_eq!(first.delivery, second.delivery);
        assert_eq!(first.delivery.len(), 32);
        assert_eq!(second.content_type, "application/json");
        assert!(
            verify(&second.signature, &second.body),
            "{}",
            second.signature
        );
        assert!(!verify(&second.signature, b"{}"), "a changed body fails");
        let body: serde_json::Value = serde_json::from_slice(&second.body).unwrap();
        assert_eq!(body["event"], "call_approval.requested");
        assert_eq!(body["approval_id"], "apr_1");
        assert_eq!(body["rule"], "tenants[0].policy[2]");
        assert_eq!(body["expires_at_unix_ms"], 2);
    }

    #[tokio::test]
    async fn notify_returns_at_once_and_delivers_in_the_background() {
        let _serial = serial().await;
        let (port, mut rx) = receiver(Vec::new()).await;
        notifier().notify(&webhook(port, 1), summary());
        let got = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("delivered")
            .unwrap();
        assert!(verify(&got.signature, &got.body));
    }

    #[tokio::test]
    async fn it_gives_up_after_its_attempts_honouring_retry_after() {
        let _serial = serial().await;
        let answers = vec![
            (
                StatusCode::TOO_MANY_REQUESTS,
                vec![("retry-after", "0".to_owned())],
            ),
            (StatusCode::BAD_GATEWAY, Vec::new()),
            (StatusCode::SERVICE_UNAVAILABLE, Vec::new()),
            (StatusCode::OK, Vec::new()),
        ];
        let (port, mut rx) = receiver(answers).await;
        let outcome = notifier().deliver(&webhook(port, 3), &summary()).await;
        assert_eq!(
            outcome.to_string(),
            "gave up after 3 attempts: HTTP 503 Service Unavailable"
        );
        for _ in 0..3 {
            rx.recv().await.unwrap();
        }
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_and_honours_retry_after_within_it() {
        let b = Backoff {
            base: BACKOFF_BASE,
            cap: BACKOFF_CAP,
        };
        let waits: Vec<u128> = (1..=8).map(|n| b.wait(n, None).as_millis()).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
        assert_eq!(
            b.wait(1, Some(Duration::from_secs(7))),
            Duration::from_secs(7)
        );
        assert_eq!(b.wait(1, Some(Duration::from_secs(600))), BACKOFF_CAP);
        assert_eq!(b.wait(u32::MAX, None), BACKOFF_CAP);
    }

    #[tokio::test]
    async fn a_4xx_and_a_3xx_end_the_delivery_without_retry_or_redirect() {
        let _serial = serial().await;
        let (port, mut rx) = receiver(vec![(StatusCode::BAD_REQUEST, Vec::new())]).await;
        let outcome = notifier().deliver(&webhook(port, 5), &summary()).await;
        assert_eq!(
            outcome.to_string(),
            "gave up after 1 attempts: HTTP 400 Bad Request (not retried)"
        );
        rx.recv().await.unwrap();
        assert!(rx.try_recv().is_err());

        let (elsewhere, mut elsewhere_rx) = receiver(Vec::new()).await;
        let location = format!("http://127.0.0.1:{elsewhere}/hook");
        let (port, mut rx) = receiver(vec![(
            StatusCode::TEMPORARY_REDIRECT,
            vec![("location", location)],
        )])
        .await;
        let outcome = notifier().deliver(&webhook(port, 5), &summary()).await;
        assert!(
            outcome
                .to_string()
                .starts_with("gave up after 1 attempts: HTTP 307"),
            "{outcome}"
        );
        rx.recv().await.unwrap();
        assert!(rx.try_recv().is_err());
        assert!(
            elsewhere_rx.try_recv().is_err(),
            "the redirect was followed"
        );
    }

    #[tokio::test]
    async fn connection_errors_are_retried_and_a_refused_address_gets_nothing() {
        let _serial = serial().await;
        // A port nobody listens on: connection refused, each attempt.
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let outcome = notifier().deliver(&webhook(port, 2), &summary()).await;
        assert!(
            matches!(&outcome, Outcome::GaveUp { attempts: 2, .. }),
            "{outcome}"
        );

        // Without an upstream_allow entry, loopback is refused unsent.
        let (port, mut rx) = receiver(Vec::new()).await;
        let mut strict = Notifier::new(allow("[]"));
        strict.backoff = notifier().backoff;
        let outcome = strict.deliver(&webhook(port, 5), &summary()).await;
        let text = outcome.to_string();
        assert!(
            text.starts_with("gave up after 0 attempts: not sent: "),
            "{text}"
        );
        assert!(
            text.contains("upstream_allow") && !text.contains("in-the-query"),
            "{text}"
        );
        assert!(rx.try_recv().is_err());
        // An entry for another port does not allow this one.
        let other = Notifier::new(allow(&format!("[\"127.0.0.1:{}\"]", port ^ 1)));
        let outcome = other.deliver(&webhook(port, 1), &summary()).await;
        assert!(
            matches!(outcome, Outcome::GaveUp { attempts: 0, .. }),
            "{outcome}"
        );
    }

    /// A log sink shared with the test.
    #[derive(Clone, Default)]
    struct Logs(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Logs {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn logs_and_debug_never_show_the_secret_or_the_url_path() {
        let _serial = serial().await;
        let logs = Logs::default();
        let sink = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let (port, _rx) = receiver(vec![(StatusCode::INTERNAL_SERVER_ERROR, Vec::new())]).await;
        let hook = webhook(port, 2);
        let n = notifier();
        assert!(matches!(
            n.deliver(&hook, &summary()).await,
            Outcome::Delivered { attempts: 2 }
        ));
        let (bad, _rx) = receiver(vec![(StatusCode::UNAUTHORIZED, Vec::new())]).await;
        n.deliver(&webhook(bad, 2), &summary()).await;
        let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("outcome=delivered"), "{text}");
        assert!(
            text.contains("approval_id=apr_1") && text.contains("tenant=acme"),
            "{text}"
        );
        assert!(text.contains(&format!("host=127.0.0.1:{port}")), "{text}");
        assert!(
            text.contains("gave up after 1 attempts: HTTP 401"),
            "{text}"
        );
        let debug = format!("{hook:?} {n:?}");
        for shown in [&text, &debug] {
            for hidden in [SECRET, "in-the-query", "/hook"] {
                assert!(!shown.contains(hidden), "{hidden} in {shown}");
            }
        }
    }

    #[tokio::test]
    async fn beyond_the_in_flight_bound_a_delivery_is_dropped() {
        let _serial = serial().await;
        let n = notifier();
        let held = n
            .in_flight
            .clone()
            .acquire_many_owned(MAX_IN_FLIGHT as u32)
            .await
            .unwrap();
        let (port, mut rx) = receiver(Vec::new()).await;
        n.notify(&webhook(port, 1), summary());
        drop(held);
        // A delivery sent after the permits are back arrives; the dropped
        // one never does.
        n.notify(&webhook(port, 1), summary());
        rx.recv().await.unwrap();
        tokio::task::yield_now().await;
        assert!(rx.try_recv().is_err());
    }
}
