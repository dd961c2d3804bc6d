//! A server's `input` block (which questions of its tools may reach the
//! workers that opt in, and how long toolgate waits for them) and its
//! `roots` (answered by toolgate itself, never asked of a worker).

use std::time::Duration;

use serde::Deserialize;

use super::fields::{Errors, duration};

/// How long a worker has to answer one question, by default.
pub(super) const DEFAULT_ANSWER_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// Rounds of questions one call may take, by default.
pub(super) const DEFAULT_MAX_ROUNDS: u32 = 10;
/// How long a `request_state` handed to a worker stays valid, by default.
pub(super) const DEFAULT_STATE_TTL: Duration = Duration::from_secs(10 * 60);
/// How long toolgate remembers a task handed to a worker, by default.
pub(super) const DEFAULT_TASK_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// The most rounds any call may take.
const MAX_ROUNDS_CEILING: u32 = 100;

/// `servers[].input` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawInput {
    pub(crate) form: Option<bool>,
    pub(crate) url: Option<bool>,
    pub(crate) sampling: Option<bool>,
    pub(crate) tasks: Option<bool>,
    pub(crate) declare_on_session: Option<bool>,
    pub(crate) answer_timeout: Option<String>,
    pub(crate) max_rounds: Option<u32>,
    pub(crate) state_ttl: Option<String>,
    pub(crate) task_ttl: Option<String>,
}

/// One entry of `servers[].roots` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoot {
    pub(crate) uri: String,
    pub(crate) name: Option<String>,
}

/// What a server's tools may ask of the workers that opt in, and the
/// bounds on it. Every kind is allowed by default: a question reaches a
/// worker only when its call opted in to that kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputConfig {
    /// Form questions may reach workers.
    pub form: bool,
    /// URL questions may reach workers.
    pub url: bool,
    /// Sampling requests may reach workers.
    pub sampling: bool,
    /// Calls may become tasks (toolgate declares the tasks extension).
    pub tasks: bool,
    /// Declare the allowed kinds at `initialize` (2025-11-25 sessions,
    /// which declare capabilities once for every call on the session).
    /// Default: on, but with `lifecycle: discover` (whose calls declare
    /// their own). A question tied to a call that did not opt in is
    /// refused to the server either way.
    pub declare_on_session: bool,
    /// How long a worker has to answer one question.
    pub answer_timeout: Duration,
    /// Rounds of questions one call may take.
    pub max_rounds: u32,
    /// How long a `request_state` handed to a worker stays valid.
    pub state_ttl: Duration,
    /// How long a task handed to a worker is remembered.
    pub task_ttl: Duration,
}

impl Default for InputConfig {
    fn default() -> Self {
        Self {
            form: true,
            url: true,
            sampling: true,
            tasks: true,
            declare_on_session: false,
            answer_timeout: DEFAULT_ANSWER_TIMEOUT,
            max_rounds: DEFAULT_MAX_ROUNDS,
            state_ttl: DEFAULT_STATE_TTL,
            task_ttl: DEFAULT_TASK_TTL,
        }
    }
}

/// A root toolgate lists to the server (`roots/list`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    /// A `file://` URI.
    pub uri: String,
    /// Its name, if given.
    pub name: Option<String>,
}

/// Validates `servers[].input` at `path`, for a server of `lifecycle`
/// (which sets the default of `declare_on_session`).
pub(super) fn input(
    errors: &mut Errors,
    path: &str,
    raw: Option<RawInput>,
    lifecycle: super::Lifecycle,
) -> InputConfig {
    let default = InputConfig {
        declare_on_session: lifecycle != super::Lifecycle::Discover,
        ..InputConfig::default()
    };
    let Some(raw) = raw else {
        return default;
    };
    let max_rounds = match raw.max_rounds {
        None => default.max_rounds,
        Some(n) if (1..=MAX_ROUNDS_CEILING).contains(&n) => n,
        Some(n) => {
            errors.push(
                format!("{path}.max_rounds"),
                format!("{n} is out of range: give 1 to {MAX_ROUNDS_CEILING}"),
            );
            default.max_rounds
        }
    };
    InputConfig {
        form: raw.form.unwrap_or(default.form),
        url: raw.url.unwrap_or(default.url),
        sampling: raw.sampling.unwrap_or(default.sampling),
        tasks: raw.tasks.unwrap_or(default.tasks),
        declare_on_session: raw.declare_on_session.unwrap_or(default.declare_on_session),
        answer_timeout: duration(
            errors,
            &format!("{path}.answer_timeout"),
            raw.answer_timeout.as_deref(),
            default.answer_timeout,
        ),
        max_rounds,
        state_ttl: duration(
            errors,
            &format!("{path}.state_ttl"),
            raw.state_ttl.as_deref(),
            default.state_ttl,
        ),
        task_ttl: duration(
            errors,
            &format!("{path}.task_ttl"),
            raw.task_ttl.as_deref(),
            default.task_ttl,
        ),
    }
}

/// Validates `servers[].roots` at `path`: `file://` URIs, each once.
pub(super) fn roots(errors: &mut Errors, path: &str, raw: Option<Vec<RawRoot>>) -> Vec<Root> {
    let mut roots: Vec<Root> = Vec::new();
    for (i, root) in raw.unwrap_or_default().into_iter().enumerate() {
        let at = format!("{path}[{i}].uri");
        match url::Url::parse(&root.uri) {
            Ok(parsed) if parsed.scheme() == "file" => {}
            Ok(_) => {
                errors.push(at, format!("`{}` is not a file:// URI", root.uri));
                continue;
            }
            Err(e) => {
                errors.push(at, format!("`{}` is not a URI: {e}", root.uri));
                continue;
            }
        }
        if roots.iter().any(|r| r.uri == root.uri) {
            errors.push(at, format!("`{}` is listed twice", root.uri));
            continue;
        }
        roots.push(Root {
            uri: root.uri,
            name: root.name,
        });
    }
    roots
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_allows_every_kind_with_the_documented_bounds() {
        use super::super::Lifecycle;
        let mut errors = Errors(Vec::new());
        let config = input(&mut errors, "p", None, Lifecycle::Discover);
        assert_eq!(config, InputConfig::default());
        assert!(config.form && config.url && config.sampling && config.tasks);
        assert!(!config.declare_on_session);
        // Issue 37: a 2025-11-25 session declares what calls may opt in
        // to, so that the opt-in on a call is enough.
        for lifecycle in [Lifecycle::Initialize, Lifecycle::Auto] {
            assert!(input(&mut errors, "p", None, lifecycle).declare_on_session);
            let raw = RawInput {
                declare_on_session: Some(false),
                ..RawInput::default()
            };
            assert!(!input(&mut errors, "p", Some(raw), lifecycle).declare_on_session);
        }
        assert!(errors.0.is_empty());
    }

    #[test]
    fn bad_values_name_their_field() {
        let mut errors = Errors(Vec::new());
        let raw = RawInput {
            max_rounds: Some(0),
            answer_timeout: Some("soon".into()),
            ..RawInput::default()
        };
        input(
            &mut errors,
            "tenants[0].servers[0].input",
            Some(raw),
            super::super::Lifecycle::Initialize,
        );
        let paths: Vec<_> = errors.0.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "tenants[0].servers[0].input.max_rounds",
                "tenants[0].servers[0].input.answer_timeout"
            ]
        );
        let raw = vec![
            RawRoot {
                uri: "https://x".into(),
                name: None,
            },
            RawRoot {
                uri: "file:///srv/a".into(),
                name: Some("a".into()),
            },
            RawRoot {
                uri: "file:///srv/a".into(),
                name: None,
            },
        ];
        let mut errors = Errors(Vec::new());
        let roots = roots(&mut errors, "r", Some(raw));
        assert_eq!(roots.len(), 1);
        assert_eq!(errors.0.len(), 2, "{:?}", errors.0);
    }
}
