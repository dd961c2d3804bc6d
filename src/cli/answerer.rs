//! Who answers a tool's questions for `toolgate call`: the person at the
//! terminal ([`super::prompt`]) or an `--input` file
//! ([`super::answers`]).

use std::io::IsTerminal;

use crate::pb;

use super::answers::{AnswerError, AnswerFile};
use super::prompt::{self, PromptError};

/// A round of questions could not be answered.
#[derive(Debug, thiserror::Error)]
pub(super) enum AskError {
    /// The `--input` file does not answer a question, or not fittingly.
    #[error(transparent)]
    File(#[from] AnswerError),
    /// The terminal failed.
    #[error(transparent)]
    Prompt(#[from] PromptError),
    /// The thread reading the terminal stopped.
    #[error("the terminal prompt stopped")]
    Stopped,
}

/// Where the answers come from.
#[derive(Debug)]
pub(super) enum Answerer {
    /// Prompts on stderr, answers from stdin.
    Terminal,
    /// The `--input` file.
    File(AnswerFile),
}

impl Answerer {
    /// The file when given, else the terminal when stdin is one, else
    /// nobody (the call opts in to nothing, as before questions existed).
    ///
    /// # Errors
    /// When the file cannot be read or parsed.
    pub(super) fn choose(input: Option<&std::path::Path>) -> Result<Option<Self>, AnswerError> {
        match input {
            Some(path) => Ok(Some(Self::File(AnswerFile::load(path)?))),
            None if std::io::stdin().is_terminal() => Ok(Some(Self::Terminal)),
            None => Ok(None),
        }
    }

    /// The kinds of question this answerer takes: a terminal answers forms
    /// and URLs (it has no model for sampling); a file may answer any.
    #[must_use]
    pub(super) fn accepts(&self) -> pb::InputCapabilities {
        pb::InputCapabilities {
            form: true,
            url: true,
            sampling: matches!(self, Self::File(_)),
        }
    }

    /// The answers to one round of questions, in the questions' order.
    ///
    /// # Errors
    /// [`AskError`]: a question the file does not answer, a terminal that
    /// fails.
    pub(super) async fn answer(
        &mut self,
        asked: &pb::InputRequired,
    ) -> Result<Vec<pb::InputResponse>, AskError> {
        match self {
            Self::File(file) => Ok(asked
                .requests
                .iter()
                .map(|q| file.answer(q))
                .collect::<Result<_, _>>()?),
            Self::Terminal => {
                // A plain thread, not the blocking pool: a read that never
                // returns (Ctrl-C while prompting) must not hold up exit.
                let (tx, rx) = tokio::sync::oneshot::channel();
                let requests = asked.requests.clone();
                std::thread::spawn(move || {
                    let mut input = std::io::stdin().lock();
                    let mut out = std::io::stderr().lock();
                    let answers = requests
                        .iter()
                        .map(|q| prompt::ask(q, &mut input, &mut out))
                        .collect::<Result<Vec<_>, _>>();
                    let _ = tx.send(answers);
                });
                Ok(rx.await.map_err(|_| AskError::Stopped)??)
            }
        }
    }
}
