//! The circuit breakers (step 9 of the pipeline): a server that keeps
//! failing is failed fast instead of holding every caller's deadline.
//!
//! One breaker per tenant × server, and per subject for a per-user server
//! (each subject's session and credential are its own). After
//! `circuit_breaker.failures` breaking failures in a row ([`judge`]: the
//! transport failed, the server's own timeout ran out, HTTP 5xx, a session
//! that could not be established) the breaker opens: calls fail at once
//! with `UNAVAILABLE` / `SERVER_CIRCUIT_OPEN`, nothing sent. After the
//! cool-down one call goes through as the probe (half-open; calls meanwhile
//! still fail fast): an answer closes the breaker, a breaking failure opens
//! it again with the cool-down doubled (up to `max_cool_down`), and a probe
//! that ends without either (refused later by a guard, cancelled) lets the
//! next call probe. Any answer of the server (a tool's `isError` and a
//! JSON-RPC error included) closes the breaker and ends the run; toolgate's
//! own refusals and the caller's deadline count for nothing. A session
//! established (the supervisor's reconnect, a subject's new per-user
//! session) closes an open breaker too, without ending the run: a server
//! that fails again at once opens again at once.
//!
//! Memory: a breaker exists only while it counts failures or is open (a
//! success forgets it); a server's subjects are at most
//! [`MAX_SUBJECTS`], closed ones evicted first; a retired server's breakers
//! go with it ([`SessionEvents::retired`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::error::CallError;
use super::routed::Routed;
use crate::config::CircuitBreaker;
use crate::registry::SessionEvents;
use crate::telemetry::Metrics;
use crate::telemetry::metrics::CircuitMetrics;
use crate::upstream::UpstreamError;

/// Most subjects of one per-user server whose breakers are kept; past it,
/// closed ones are evicted, then open ones whose cool-down ended, and a
/// new subject's failures are not counted while every kept one is open.
pub const MAX_SUBJECTS: usize = 4096;

/// The retry delay a call refused while the probe runs is given, at most.
const HALF_OPEN_RETRY: Duration = Duration::from_secs(1);

/// What a failed upstream request says of its server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The server is broken: the transport failed, a session could not be
    /// established, HTTP 5xx, its own timeout ran out.
    Breaking,
    /// The server answered (a JSON-RPC error, an HTTP 4xx, a malformed or
    /// oversized result): it is up.
    Answered,
    /// Nothing is known of the server: toolgate's own refusal, a
    /// credential that could not be had, the caller's side of a round.
    Neutral,
}

/// What `error` says of its server (a timeout: [`Verdict::Breaking`]; the
/// caller tells a timeout of the caller's own deadline apart).
pub(crate) fn judge(error: &UpstreamError) -> Verdict {
    match error {
        UpstreamError::Spawn { .. }
        | UpstreamError::Handshake(_)
        | UpstreamError::ConnectTimeout(_)
        | UpstreamError::Unreachable(_)
        | UpstreamError::Closed
        | UpstreamError::Lost
        | UpstreamError::Transport(_)
        | UpstreamError::Timeout(_) => Verdict::Breaking,
        UpstreamError::HttpStatus { status, .. } if *status >= 500 => Verdict::Breaking,
        error if error.is_credential_failure() => Verdict::Neutral,
        UpstreamError::AddressRefused { .. }
        | UpstreamError::InputRequiresInteractive(_)
        | UpstreamError::InputAnswerTimeout(_)
        | UpstreamError::InputRoundsExceeded(_)
        | UpstreamError::InputAbandoned
        | UpstreamError::ListTools(_)
        | UpstreamError::TooManyPages(_)
        | UpstreamError::RepeatedCursor => Verdict::Neutral,
        _ => Verdict::Answered,
    }
}

/// A breaker as a listing shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Circuit {
    /// Switched off (`circuit_breaker.enabled: false`).
    Off,
    /// Calls go through.
    Closed,
    /// Calls fail fast; the next probe may go in `retry_after` (zero: the
    /// next call is the probe).
    Open {
        /// Until the cool-down ends.
        retry_after: Duration,
    },
    /// One probe call is under way; the others fail fast.
    HalfOpen,
}

/// One breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Counting breaking failures in a row.
    Closed { failures: u32 },
    /// Failing calls fast until `until`.
    Open { until: Instant },
    /// The probe `probe` is under way.
    HalfOpen { probe: u64 },
}

/// One breaker: its state, how many times in a row it opened (the
/// cool-down doubles with each), and the settings it was made with.
#[derive(Debug, Clone, Copy)]
struct Breaker {
    state: State,
    opens: u32,
    config: CircuitBreaker,
}

impl Breaker {
    fn is_open(&self) -> bool {
        !matches!(self.state, State::Closed { .. })
    }
}

/// One server's breakers: the server's own, or each subject's.
#[derive(Debug, Default)]
struct ServerBreakers {
    shared: Option<Breaker>,
    subjects: HashMap<String, Breaker>,
}

impl ServerBreakers {
    fn open_count(&self) -> usize {
        self.shared.iter().filter(|b| b.is_open()).count()
            + self.subjects.values().filter(|b| b.is_open()).count()
    }

    fn is_empty(&self) -> bool {
        self.shared.is_none() && self.subjects.is_empty()
    }
}

/// Which breaker: a tenant's server, and the subject's key for a per-user
/// server.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    tenant: String,
    server: String,
    subject: Option<String>,
}

/// Every breaker of a gateway's calls, by tenant and server.
#[derive(Debug)]
pub struct Breakers {
    metrics: Arc<Metrics>,
    tenants: Mutex<HashMap<String, HashMap<String, ServerBreakers>>>,
    /// Whether `tenants` holds any breaker (set under its lock): while
    /// none is kept, a call passes and succeeds without taking the lock.
    kept: AtomicBool,
    probes: AtomicU64,
}

/// A call's passage through its server's breaker: what the call comes to
/// is recorded on it once ([`Pass::session_failed`], [`Pass::answered`]);
/// dropped without that, it records nothing (and a probe lets the next
/// call probe).
#[derive(Debug)]
pub(crate) struct Pass<'a> {
    breakers: &'a Breakers,
    /// `None`: no breaker (switched off), or recorded already.
    key: Option<Key>,
    config: CircuitBreaker,
    probe: Option<u64>,
}

impl Breakers {
    /// No breaker open; their changes counted in `metrics`.
    #[must_use]
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            tenants: Mutex::default(),
            kept: AtomicBool::new(false),
            probes: AtomicU64::new(1),
        }
    }

    /// Step 9: the call `routed` of `origin`'s passes its server's
    /// breaker, or fails fast.
    ///
    /// # Errors
    /// The breaker is open, or half-open with its probe under way
    /// (`SERVER_CIRCUIT_OPEN`, nothing sent).
    pub(crate) fn pass<E>(
        &self,
        routed: &Routed<E>,
        origin: &super::Origin,
    ) -> Result<Pass<'_>, CallError> {
        let Some(config) = routed.config().circuit_breaker else {
            return Ok(self.unguarded());
        };
        let key = Key {
            tenant: routed.tenant.name.clone(),
            server: routed.server.clone(),
            subject: routed
                .tenant
                .is_per_user(routed.index)
                .then(|| origin.subject.key().to_owned()),
        };
        match self.check_at(&key, Instant::now()) {
            Ok(probe) => Ok(Pass {
                breakers: self,
                key: Some(key),
                config,
                probe,
            }),
            Err(retry_after) => Err(CallError::CircuitOpen {
                server: routed.server.clone(),
                tool: routed.target.clone(),
                retry_after,
                per_subject: key.subject.is_some(),
            }),
        }
    }

    /// A pass that records nothing (no breaker).
    fn unguarded(&self) -> Pass<'_> {
        Pass {
            breakers: self,
            key: None,
            config: CircuitBreaker::default(),
            probe: None,
        }
    }

    /// The state of the breaker of `tenant`'s `server` (for a per-user
    /// server, `subject`'s), with its settings `config` (`None`: off).
    #[must_use]
    pub fn circuit(
        &self,
        tenant: &str,
        server: &str,
        subject: Option<&str>,
        config: Option<&CircuitBreaker>,
    ) -> Circuit {
        if config.is_none() {
            return Circuit::Off;
        }
        let tenants = self.tenants.lock().expect("breakers lock");
        let breaker = tenants
            .get(tenant)
            .and_then(|servers| servers.get(server))
            .and_then(|breakers| match subject {
                None => breakers.shared.as_ref(),
                Some(subject) => breakers.subjects.get(subject),
            });
        match breaker.map(|b| b.state) {
            None | Some(State::Closed { .. }) => Circuit::Closed,
            Some(State::Open { until }) => Circuit::Open {
                retry_after: until.saturating_duration_since(Instant::now()),
            },
            Some(State::HalfOpen { .. }) => Circuit::HalfOpen,
        }
    }

    /// Whether a call may pass `key`'s breaker at `now`: `Ok(Some(probe))`
    /// for the probe of a breaker whose cool-down ended, `Err(retry_after)`
    /// when it fails fast.
    fn check_at(&self, key: &Key, now: Instant) -> Result<Option<u64>, Duration> {
        if !self.kept.load(Ordering::Acquire) {
            return Ok(None);
        }
        let mut tenants = self.tenants.lock().expect("breakers lock");
        let Some(breaker) = find(&mut tenants, key) else {
            return Ok(None);
        };
        match breaker.state {
            State::Closed { .. } => Ok(None),
            State::Open { until } if now < until => Err(until - now),
            State::Open { .. } => {
                let probe = self.probes.fetch_add(1, Ordering::Relaxed);
                breaker.state = State::HalfOpen { probe };
                tracing::info!(tenant = %key.tenant, server = %key.server, per_subject = key.subject.is_some(), "circuit half-open: one probe call goes through");
                Ok(Some(probe))
            }
            State::HalfOpen { .. } => Err(HALF_OPEN_RETRY.min(breaker.config.cool_down)),
        }
    }

    /// A breaking failure of a call that passed `key`'s breaker (as the
    /// probe `probe`, or not) at `now`.
    fn failed_at(&self, key: &Key, config: CircuitBreaker, probe: Option<u64>, now: Instant) {
        let mut tenants = self.tenants.lock().expect("breakers lock");
        self.kept.store(true, Ordering::Release);
        let Some(breaker) = find_or_insert(&mut tenants, key, config, now, self.metrics.circuits())
        else {
            tracing::debug!(tenant = %key.tenant, server = %key.server, "circuit not counted: every kept subject's breaker is open");
            return;
        };
        match breaker.state {
            State::Closed { failures } => {
                let failures = failures.saturating_add(1);
                if failures < breaker.config.failures {
                    breaker.state = State::Closed { failures };
                    return;
                }
                breaker.opens = breaker.opens.saturating_add(1);
                let cool_down = breaker.config.cool_down_of(breaker.opens);
                breaker.state = State::Open {
                    until: now + cool_down,
                };
                self.metrics.circuits().opened(&key.tenant, &key.server);
                tracing::warn!(
                    tenant = %key.tenant,
                    server = %key.server,
                    per_subject = key.subject.is_some(),
                    failures,
                    cool_down = %humantime::format_duration(cool_down),
                    "circuit opened: calls fail fast until a probe succeeds"
                );
            }
            State::HalfOpen { probe: running } if Some(running) == probe => {
                breaker.opens = breaker.opens.saturating_add(1);
                let cool_down = breaker.config.cool_down_of(breaker.opens);
                breaker.state = State::Open {
                    until: now + cool_down,
                };
                self.metrics.circuits().reopened(&key.tenant, &key.server);
                tracing::warn!(
                    tenant = %key.tenant,
                    server = %key.server,
                    per_subject = key.subject.is_some(),
                    cool_down = %humantime::format_duration(cool_down),
                    "circuit reopened: the probe call failed"
                );
            }
            // A call that passed before the breaker opened: it is open
            // already.
            State::HalfOpen { .. } | State::Open { .. } => {}
        }
    }

    /// The server answered a call that passed `key`'s breaker (as the
    /// probe `probe`, or not): the breaker closes and is forgotten.
    fn answered(&self, key: &Key, probe: Option<u64>) {
        if !self.kept.load(Ordering::Acquire) {
            return;
        }
        let mut tenants = self.tenants.lock().expect("breakers lock");
        let Some(servers) = tenants.get_mut(&key.tenant) else {
            return;
        };
        let Some(breakers) = servers.get_mut(&key.server) else {
            return;
        };
        let removed = match &key.subject {
            None => breakers.shared.take(),
            Some(subject) => breakers.subjects.remove(subject),
        };
        if breakers.is_empty() {
            servers.remove(&key.server);
            if servers.is_empty() {
                tenants.remove(&key.tenant);
            }
        }
        self.kept.store(!tenants.is_empty(), Ordering::Release);
        drop(tenants);
        let Some(removed) = removed else {
            return;
        };
        if removed.is_open() {
            let circuits = self.metrics.circuits();
            circuits.closed(&key.tenant, &key.server, 1);
            if probe.is_some() {
                circuits.probe(&key.tenant, &key.server, "closed");
            }
            tracing::info!(tenant = %key.tenant, server = %key.server, per_subject = key.subject.is_some(), "circuit closed: the server answered");
        }
    }

    /// The probe `probe` of `key`'s breaker ended with nothing learned:
    /// the next call probes.
    fn released_at(&self, key: &Key, probe: u64, now: Instant) {
        let mut tenants = self.tenants.lock().expect("breakers lock");
        if let Some(breaker) = find(&mut tenants, key)
            && breaker.state == (State::HalfOpen { probe })
        {
            breaker.state = State::Open { until: now };
            drop(tenants);
            self.metrics
                .circuits()
                .probe(&key.tenant, &key.server, "released");
        }
    }

    /// A session established: the open breakers it concerns close, with
    /// their run of failures kept (one more failure opens them again).
    fn reconnected(&self, tenant: &str, server: &str, subject: Option<&str>) {
        let mut tenants = self.tenants.lock().expect("breakers lock");
        let Some(breakers) = tenants.get_mut(tenant).and_then(|s| s.get_mut(server)) else {
            return;
        };
        let mut closed = 0;
        let mut close = |breaker: &mut Breaker| {
            if breaker.is_open() {
                breaker.state = State::Closed {
                    failures: breaker.config.failures.saturating_sub(1),
                };
                closed += 1;
            }
        };
        match subject {
            // The server's own session: every breaker of the server.
            None => {
                breakers.shared.iter_mut().for_each(&mut close);
                breakers.subjects.values_mut().for_each(&mut close);
            }
            Some(subject) => breakers
                .subjects
                .get_mut(subject)
                .into_iter()
                .for_each(close),
        }
        drop(tenants);
        if closed > 0 {
            self.metrics.circuits().closed(tenant, server, closed);
            tracing::info!(
                tenant,
                server,
                closed,
                "circuit closed: a session was established"
            );
        }
    }

    /// Forgets every breaker of `tenant`'s `server` (retired).
    fn forget(&self, tenant: &str, server: &str) {
        let mut tenants = self.tenants.lock().expect("breakers lock");
        let Some(servers) = tenants.get_mut(tenant) else {
            return;
        };
        let Some(breakers) = servers.remove(server) else {
            return;
        };
        if servers.is_empty() {
            tenants.remove(tenant);
        }
        self.kept.store(!tenants.is_empty(), Ordering::Release);
        drop(tenants);
        self.metrics
            .circuits()
            .closed(tenant, server, breakers.open_count());
    }
}

impl SessionEvents for Breakers {
    fn connected(&self, tenant: &str, server: &str, subject: Option<&str>) {
        self.reconnected(tenant, server, subject);
    }

    fn retired(&self, tenant: &str, server: &str) {
        self.forget(tenant, server);
    }
}

/// `key`'s breaker, if it has one.
fn find<'a>(
    tenants: &'a mut HashMap<String, HashMap<String, ServerBreakers>>,
    key: &Key,
) -> Option<&'a mut Breaker> {
    let breakers = tenants.get_mut(&key.tenant)?.get_mut(&key.server)?;
    match &key.subject {
        None => breakers.shared.as_mut(),
        Some(subject) => breakers.subjects.get_mut(subject),
    }
}

/// `key`'s breaker, made closed with `config` if it has none; `None` when a
/// subject's would exceed [`MAX_SUBJECTS`] and none can be evicted.
fn find_or_insert<'a>(
    tenants: &'a mut HashMap<String, HashMap<String, ServerBreakers>>,
    key: &Key,
    config: CircuitBreaker,
    now: Instant,
    circuits: &CircuitMetrics,
) -> Option<&'a mut Breaker> {
    let fresh = Breaker {
        state: State::Closed { failures: 0 },
        opens: 0,
        config,
    };
    let breakers = tenants
        .entry(key.tenant.clone())
        .or_default()
        .entry(key.server.clone())
        .or_default();
    let Some(subject) = &key.subject else {
        return Some(breakers.shared.get_or_insert(fresh));
    };
    if !breakers.subjects.contains_key(subject) && breakers.subjects.len() >= MAX_SUBJECTS {
        // Closed ones first, then open ones whose cool-down ended (their
        // next call would probe): neither is counted open when evicted.
        breakers.subjects.retain(|_, b| b.is_open());
        if breakers.subjects.len() >= MAX_SUBJECTS {
            let before = breakers.subjects.len();
            breakers
                .subjects
                .retain(|_, b| !matches!(b.state, State::Open { until } if until <= now));
            // They were counted open: the gauge goes down with them.
            circuits.closed(&key.tenant, &key.server, before - breakers.subjects.len());
        }
        if breakers.subjects.len() >= MAX_SUBJECTS {
            return None;
        }
    }
    Some(breakers.subjects.entry(subject.clone()).or_insert(fresh))
}

impl Pass<'_> {
    /// Step 8: the session could not be had; `error` counts when it says
    /// the server is broken (a per-user session that could not be
    /// established).
    pub(crate) fn session_failed(&mut self, error: &CallError) {
        if let CallError::Upstream { error, .. } = error
            && judge(error) == Verdict::Breaking
        {
            self.failed();
        }
    }

    /// Step 16: what the upstream request came to. `own_timeout`: the
    /// request's timeout was the server's own (or longer), so a timeout is
    /// the server's failure rather than the caller's deadline.
    pub(crate) fn answered<T>(&mut self, result: &Result<T, UpstreamError>, own_timeout: bool) {
        match result {
            Ok(_) => self.succeeded(),
            Err(UpstreamError::Timeout(_)) if !own_timeout => {}
            Err(error) => match judge(error) {
                Verdict::Breaking => self.failed(),
                Verdict::Answered => self.succeeded(),
                Verdict::Neutral => {}
            },
        }
    }

    fn failed(&mut self) {
        if let Some(key) = self.key.take() {
            self.breakers
                .failed_at(&key, self.config, self.probe.take(), Instant::now());
        }
    }

    fn succeeded(&mut self) {
        if let Some(key) = self.key.take() {
            self.breakers.answered(&key, self.probe.take());
        }
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        if let (Some(key), Some(probe)) = (self.key.take(), self.probe.take()) {
            self.breakers.released_at(&key, probe, Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> CircuitBreaker {
        CircuitBreaker {
            failures: 3,
            cool_down: Duration::from_secs(10),
            max_cool_down: Duration::from_secs(25),
        }
    }

    fn key(subject: Option<&str>) -> Key {
        Key {
            tenant: "t".to_owned(),
            server: "s".to_owned(),
            subject: subject.map(str::to_owned),
        }
    }

    fn breakers() -> Breakers {
        Breakers::new(Arc::new(Metrics::new()))
    }

    fn gauge(breakers: &Breakers) -> Option<String> {
        let page = breakers.metrics.encode();
        page.lines()
            .find(|l| l.starts_with("toolgate_circuit_open{"))
            .map(|l| l.rsplit(' ').next().unwrap().to_owned())
    }

    /// Fails `n` calls of `key` at `now`.
    fn fail(breakers: &Breakers, key: &Key, n: usize, now: Instant) {
        for _ in 0..n {
            let probe = breakers.check_at(key, now).expect("passes");
            breakers.failed_at(key, config(), probe, now);
        }
    }

    #[test]
    fn a_run_of_failures_opens_and_a_probe_closes() {
        let b = breakers();
        let k = key(None);
        let t0 = Instant::now();
        fail(&b, &k, 2, t0);
        assert_eq!(b.check_at(&k, t0), Ok(None), "two of three: still closed");
        fail(&b, &k, 1, t0);
        assert_eq!(b.check_at(&k, t0), Err(Duration::from_secs(10)));
        assert_eq!(
            b.check_at(&k, t0 + Duration::from_secs(4)),
            Err(Duration::from_secs(6))
        );
        assert_eq!(gauge(&b).as_deref(), Some("1"));

        // The cool-down over: exactly one probe; the rest fail fast.
        let later = t0 + Duration::from_secs(10);
        let probe = b.check_at(&k, later).unwrap();
        assert!(probe.is_some());
        assert_eq!(b.check_at(&k, later), Err(Duration::from_secs(1)));
        b.answered(&k, probe);
        assert_eq!(b.check_at(&k, later), Ok(None));
        assert_eq!(gauge(&b).as_deref(), Some("0"));
        assert!(
            b.tenants.lock().unwrap().is_empty(),
            "a closed breaker is forgotten"
        );
    }

    #[test]
    fn a_failed_probe_reopens_with_the_cool_down_doubled_up_to_the_maximum() {
        let b = breakers();
        let k = key(None);
        let mut now = Instant::now();
        fail(&b, &k, 3, now);
        for expected in [20, 25, 25] {
            now += Duration::from_secs(30);
            let probe = b.check_at(&k, now).unwrap();
            b.failed_at(&k, config(), probe, now);
            assert_eq!(b.check_at(&k, now), Err(Duration::from_secs(expected)));
        }
        assert_eq!(gauge(&b).as_deref(), Some("1"));
    }

    #[test]
    fn a_released_probe_lets_the_next_call_probe() {
        let b = breakers();
        let k = key(None);
        let t0 = Instant::now();
        fail(&b, &k, 3, t0);
        let later = t0 + Duration::from_secs(11);
        let first = b.check_at(&k, later).unwrap().unwrap();
        // A failure of a call that passed before it opened changes nothing.
        b.failed_at(&k, config(), None, later);
        assert!(b.check_at(&k, later).is_err());
        b.released_at(&k, first, later);
        let second = b.check_at(&k, later).unwrap().unwrap();
        assert_ne!(first, second);
        // The first probe's late release does not free the second's slot.
        b.released_at(&k, first, later);
        assert!(b.check_at(&k, later).is_err());
    }

    #[test]
    fn a_pass_dropped_without_a_result_releases_its_probe() {
        let b = breakers();
        let k = key(None);
        let t0 = Instant::now() - Duration::from_secs(60);
        fail(&b, &k, 3, t0);
        let probe = b.check_at(&k, Instant::now()).unwrap();
        drop(Pass {
            breakers: &b,
            key: Some(k.clone()),
            config: config(),
            probe,
        });
        assert!(b.check_at(&k, Instant::now()).unwrap().is_some());
    }

    #[test]
    fn an_answer_ends_the_run_and_a_neutral_end_leaves_it() {
        let b = breakers();
        let k = key(None);
        let now = Instant::now();
        let pass = |b| Pass {
            breakers: b,
            key: Some(k.clone()),
            config: config(),
            probe: None,
        };
        fail(&b, &k, 2, now);
        let answered: Result<(), _> = Err(UpstreamError::JsonRpc {
            code: -32603,
            message: "boom".to_owned(),
        });
        pass(&b).answered(&answered, true);
        fail(&b, &k, 2, now);
        // The caller's deadline, a credential failure: nothing learned.
        pass(&b).answered::<()>(&Err(UpstreamError::Timeout(Duration::from_secs(1))), false);
        pass(&b).answered::<()>(&Err(UpstreamError::TokenFailed("x".to_owned())), true);
        assert_eq!(b.check_at(&k, now), Ok(None));
        // The server's own timeout: the third in a row.
        pass(&b).answered::<()>(&Err(UpstreamError::Timeout(Duration::from_secs(1))), true);
        assert!(b.check_at(&k, now).is_err());
    }

    #[test]
    fn subjects_are_apart_and_a_reconnect_closes_without_ending_the_run() {
        let b = breakers();
        let (alice, bob) = (key(Some("u:alice")), key(Some("u:bob")));
        let now = Instant::now();
        fail(&b, &alice, 3, now);
        assert!(b.check_at(&alice, now).is_err());
        assert_eq!(b.check_at(&bob, now), Ok(None));
        assert_eq!(
            b.circuit("t", "s", Some("u:bob"), Some(&config())),
            Circuit::Closed
        );
        assert!(matches!(
            b.circuit("t", "s", Some("u:alice"), Some(&config())),
            Circuit::Open { .. }
        ));
        b.connected("t", "s", Some("u:alice"));
        assert_eq!(b.check_at(&alice, now), Ok(None));
        assert_eq!(gauge(&b).as_deref(), Some("0"));
        // One more failure opens it again, with the cool-down doubled.
        fail(&b, &alice, 1, now);
        assert_eq!(b.check_at(&alice, now), Err(Duration::from_secs(20)));
        // The server's own session closes every subject's.
        b.connected("t", "s", None);
        assert_eq!(b.check_at(&alice, now), Ok(None));
        b.retired("t", "s");
        assert!(b.tenants.lock().unwrap().is_empty());
    }

    #[test]
    fn subjects_are_bounded_closed_ones_evicted_first() {
        let b = breakers();
        let now = Instant::now();
        for n in 0..MAX_SUBJECTS {
            let k = key(Some(&format!("u:{n}")));
            // Half open, half counting.
            fail(&b, &k, if n % 2 == 0 { 3 } else { 1 }, now);
        }
        let newcomer = key(Some("u:new"));
        fail(&b, &newcomer, 1, now);
        let count = |b: &Breakers| b.tenants.lock().unwrap()["t"]["s"].subjects.len();
        assert_eq!(count(&b), MAX_SUBJECTS / 2 + 1, "the closed ones went");
        // Fill with open ones: a newcomer is not counted, until the
        // cool-downs end and they can go.
        for n in 0..MAX_SUBJECTS {
            fail(&b, &key(Some(&format!("v:{n}"))), 3, now);
        }
        assert!(count(&b) <= MAX_SUBJECTS);
        let late = now + Duration::from_secs(11);
        fail(&b, &key(Some("u:late")), 1, late);
        assert_eq!(count(&b), 1, "open ones whose cool-down ended are evicted");
        assert_eq!(gauge(&b).as_deref(), Some("0"));
    }

    #[test]
    fn what_breaks_a_server() {
        use UpstreamError as U;
        for breaking in [
            U::Lost,
            U::Closed,
            U::Transport("reset".to_owned()),
            U::HttpStatus {
                status: 503,
                body: String::new(),
            },
            U::ConnectTimeout(Duration::from_secs(1)),
        ] {
            assert_eq!(judge(&breaking), Verdict::Breaking, "{breaking:?}");
        }
        for answered in [
            U::HttpStatus {
                status: 429,
                body: String::new(),
            },
            U::AuthRejected { challenge: None },
            U::Protocol("garbage".to_owned()),
        ] {
            assert_eq!(judge(&answered), Verdict::Answered, "{answered:?}");
        }
        assert_eq!(judge(&U::TokenFailed(String::new())), Verdict::Neutral);
    }
}
