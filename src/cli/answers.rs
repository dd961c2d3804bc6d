//! `toolgate call --input FILE`: answers to a tool's questions, read from a
//! JSON file instead of asked on a terminal ([cli.md](../../docs/cli.md)).
//!
//! The file is a list of answers, or a map of question id to answer. Each
//! answer is used once. A question takes the unused answer whose `id` is
//! its id, else the first unused answer without an `id` whose `kind` (when
//! given) is its kind. A question the file does not answer is an error
//! naming it: nothing is ever answered on the user's behalf.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::pb;
use crate::pb::input_request::Kind;

/// The file could not be used, or does not answer a question.
#[derive(Debug, thiserror::Error)]
pub(super) enum AnswerError {
    /// The file cannot be read.
    #[error("cannot read --input {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a list or map of answers.
    #[error("--input {path} is not a list or map of answers: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where and why.
        source: serde_json::Error,
    },
    /// An answer does not fit its question.
    #[error("--input {path}: answer {entry} for question {question}: {problem}")]
    Unfit {
        /// The file.
        path: PathBuf,
        /// The answer (`#3` in a list, `"id"` in a map).
        entry: String,
        /// The question, described.
        question: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// No unused answer fits a question.
    #[error("--input {path} has no answer for question {question}")]
    Unanswered {
        /// The file.
        path: PathBuf,
        /// The question, described.
        question: String,
    },
}

/// What to do with a question, in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum FileAction {
    Accept,
    Decline,
    Cancel,
}

/// A question kind, in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum FileKind {
    Form,
    Url,
    Sampling,
}

/// One answer of the file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    /// The question id it answers; absent: the next question that fits.
    #[serde(default)]
    id: Option<String>,
    /// Only for a question of this kind.
    #[serde(default)]
    kind: Option<FileKind>,
    action: FileAction,
    /// The form's values, or the sampling result (accept only).
    #[serde(default)]
    content: Option<Value>,
}

/// A map's value: an answer without `id` (the key is its id).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyedEntry {
    #[serde(default)]
    kind: Option<FileKind>,
    action: FileAction,
    #[serde(default)]
    content: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum FileShape {
    List(Vec<Entry>),
    Map(BTreeMap<String, KeyedEntry>),
}

/// The answers of an `--input` file, each used at most once.
#[derive(Debug)]
pub(super) struct AnswerFile {
    path: PathBuf,
    entries: Vec<(String, Entry)>,
    used: Vec<bool>,
}

impl AnswerFile {
    /// Reads and parses `path`.
    ///
    /// # Errors
    /// [`AnswerError::Read`] or [`AnswerError::Parse`].
    pub(super) fn load(path: &Path) -> Result<Self, AnswerError> {
        let text = std::fs::read_to_string(path).map_err(|source| AnswerError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses the text of a file named `path`.
    ///
    /// # Errors
    /// [`AnswerError::Parse`].
    pub(super) fn parse(path: &Path, text: &str) -> Result<Self, AnswerError> {
        let shape: FileShape = serde_json::from_str(text).map_err(|source| AnswerError::Parse {
            path: path.to_owned(),
            source,
        })?;
        let entries: Vec<(String, Entry)> = match shape {
            FileShape::List(list) => list
                .into_iter()
                .enumerate()
                .map(|(n, e)| (format!("#{}", n + 1), e))
                .collect(),
            FileShape::Map(map) => map
                .into_iter()
                .map(|(id, e)| {
                    (
                        format!("{id:?}"),
                        Entry {
                            id: Some(id),
                            kind: e.kind,
                            action: e.action,
                            content: e.content,
                        },
                    )
                })
                .collect(),
        };
        let used = vec![false; entries.len()];
        Ok(Self {
            path: path.to_owned(),
            entries,
            used,
        })
    }

    /// The answer to `question`, marking the file's entry used.
    ///
    /// # Errors
    /// [`AnswerError::Unanswered`] when no unused entry fits,
    /// [`AnswerError::Unfit`] when the entry's action or content does not
    /// suit the question's kind.
    pub(super) fn answer(
        &mut self,
        question: &pb::InputRequest,
    ) -> Result<pb::InputResponse, AnswerError> {
        let kind = file_kind(question);
        let fits = |e: &Entry| e.kind.is_none() || e.kind == kind;
        let by_id = self.entries.iter().enumerate().position(|(n, (_, e))| {
            !self.used[n] && e.id.as_deref() == Some(question.id.as_str()) && fits(e)
        });
        let index = by_id.or_else(|| {
            self.entries
                .iter()
                .enumerate()
                .position(|(n, (_, e))| !self.used[n] && e.id.is_none() && fits(e))
        });
        let Some(index) = index else {
            return Err(AnswerError::Unanswered {
                path: self.path.clone(),
                question: describe(question),
            });
        };
        self.used[index] = true;
        let (label, entry) = &self.entries[index];
        let unfit = |problem| AnswerError::Unfit {
            path: self.path.clone(),
            entry: label.clone(),
            question: describe(question),
            problem,
        };
        let content = entry.content.as_ref().filter(|c| !c.is_null());
        let (action, content_json) = match entry.action {
            FileAction::Decline | FileAction::Cancel if content.is_some() => {
                return Err(unfit("only an accepted answer has content"));
            }
            FileAction::Decline => (pb::InputAction::Decline, String::new()),
            FileAction::Cancel => (pb::InputAction::Cancel, String::new()),
            FileAction::Accept => match (kind, content) {
                (Some(FileKind::Url), None) => (pb::InputAction::Accept, String::new()),
                (Some(FileKind::Url), Some(_)) => {
                    return Err(unfit("a URL question is accepted without content"));
                }
                (Some(FileKind::Form), Some(c @ Value::Object(_))) => {
                    (pb::InputAction::Accept, c.to_string())
                }
                (Some(FileKind::Form), _) => {
                    return Err(unfit(
                        "accepting a form needs `content`: an object of its fields",
                    ));
                }
                (Some(FileKind::Sampling), Some(c @ Value::Object(_))) => {
                    (pb::InputAction::Accept, c.to_string())
                }
                (Some(FileKind::Sampling), _) => {
                    return Err(unfit(
                        "accepting a sampling question needs `content`: the model's result \
                         (role, content, model)",
                    ));
                }
                (None, _) => {
                    return Err(unfit(
                        "the question is of a kind this toolgate does not know",
                    ));
                }
            },
        };
        Ok(pb::InputResponse {
            id: question.id.clone(),
            action: action.into(),
            content_json,
        })
    }
}

fn file_kind(question: &pb::InputRequest) -> Option<FileKind> {
    match question.kind {
        Some(Kind::Form(_)) => Some(FileKind::Form),
        Some(Kind::Url(_)) => Some(FileKind::Url),
        Some(Kind::Sampling(_)) => Some(FileKind::Sampling),
        None => None,
    }
}

/// `"<id>" (<kind>: "<message>")`, for errors.
#[must_use]
pub(super) fn describe(question: &pb::InputRequest) -> String {
    let (kind, message) = match &question.kind {
        Some(Kind::Form(f)) => ("form", f.message.as_str()),
        Some(Kind::Url(u)) => ("url", u.message.as_str()),
        Some(Kind::Sampling(_)) => ("sampling", ""),
        None => ("unknown kind", ""),
    };
    if message.is_empty() {
        format!("{:?} ({kind})", question.id)
    } else {
        format!("{:?} ({kind}: {message:?})", question.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(id: &str, message: &str) -> pb::InputRequest {
        pb::InputRequest {
            id: id.to_owned(),
            kind: Some(Kind::Form(pb::FormInput {
                message: message.to_owned(),
                requested_schema_json: r#"{"type":"object","properties":{}}"#.to_owned(),
            })),
        }
    }

    fn url(id: &str) -> pb::InputRequest {
        pb::InputRequest {
            id: id.to_owned(),
            kind: Some(Kind::Url(pb::UrlInput {
                message: "Open the link".to_owned(),
                url: "https://example.test/x".to_owned(),
                elicitation_id: String::new(),
            })),
        }
    }

    fn sampling(id: &str) -> pb::InputRequest {
        pb::InputRequest {
            id: id.to_owned(),
            kind: Some(Kind::Sampling(pb::SamplingInput {
                params_json: "{}".to_owned(),
            })),
        }
    }

    fn file(text: &str) -> AnswerFile {
        AnswerFile::parse(Path::new("answers.json"), text).unwrap()
    }

    #[test]
    fn a_list_answers_in_order_and_each_entry_once() {
        let mut answers = file(
            r#"[{"action":"accept","content":{"name":"Ada"}},
                {"action":"decline"}]"#,
        );
        let first = answers.answer(&form("q1", "Name?")).unwrap();
        assert_eq!(first.id, "q1");
        assert_eq!(first.action(), pb::InputAction::Accept);
        assert_eq!(first.content_json, r#"{"name":"Ada"}"#);
        let second = answers.answer(&form("q2", "Colour?")).unwrap();
        assert_eq!(
            (second.action(), second.content_json.as_str()),
            (pb::InputAction::Decline, "")
        );
        let err = answers.answer(&form("q3", "Again?")).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"--input answers.json has no answer for question "q3" (form: "Again?")"#
        );
    }

    #[test]
    fn an_id_wins_over_order_and_kind_filters() {
        let mut answers = file(
            r#"[{"kind":"url","action":"accept"},
                {"action":"cancel"},
                {"id":"__main__:ask_colour","action":"accept","content":{"colour":"red"}}]"#,
        );
        let colour = answers
            .answer(&form("__main__:ask_colour", "Colour?"))
            .unwrap();
        assert_eq!(colour.content_json, r#"{"colour":"red"}"#);
        // The url-only entry is skipped for a form; the next unnamed one fits.
        let other = answers.answer(&form("q9", "Other?")).unwrap();
        assert_eq!(other.action(), pb::InputAction::Cancel);
        let link = answers.answer(&url("link-1")).unwrap();
        assert_eq!(
            (link.action(), link.content_json.as_str()),
            (pb::InputAction::Accept, "")
        );
    }

    #[test]
    fn a_map_answers_by_id_only() {
        let mut answers = file(
            r#"{"q1": {"action":"accept","content":{"party_size":2}},
                "q2": {"action":"accept","content":{"role":"assistant","content":{"type":"text","text":"hi"},"model":"m"}}}"#,
        );
        assert!(answers.answer(&form("q1", "Book?")).is_ok());
        assert!(answers.answer(&sampling("q2")).is_ok());
        let err = answers.answer(&form("q3", "Book?")).unwrap_err();
        assert!(matches!(err, AnswerError::Unanswered { .. }), "{err}");
    }

    #[test]
    fn content_must_suit_the_kind_and_action() {
        let cases = [
            (
                r#"[{"action":"accept"}]"#,
                form("f", "F?"),
                "needs `content`",
            ),
            (
                r#"[{"action":"accept","content":[1]}]"#,
                form("f", "F?"),
                "needs `content`",
            ),
            (
                r#"[{"action":"decline","content":{"a":1}}]"#,
                form("f", "F?"),
                "only an accepted",
            ),
            (
                r#"[{"action":"accept","content":{"a":1}}]"#,
                url("u"),
                "without content",
            ),
            (
                r#"[{"action":"accept"}]"#,
                sampling("s"),
                "the model's result",
            ),
        ];
        for (text, question, want) in cases {
            let err = file(text).answer(&question).unwrap_err();
            assert!(err.to_string().contains(want), "{text}: {err}");
            assert!(err.to_string().contains("answer #1 for question"), "{err}");
        }
    }

    #[test]
    fn malformed_files_are_refused_naming_the_file() {
        for text in [
            "{",
            r#"[{"action":"maybe"}]"#,
            r#"[{"action":"accept","extra":1}]"#,
            r#""accept""#,
        ] {
            let err = AnswerFile::parse(Path::new("a.json"), text).unwrap_err();
            assert!(
                err.to_string()
                    .starts_with("--input a.json is not a list or map of answers"),
                "{text}: {err}"
            );
        }
    }
}
