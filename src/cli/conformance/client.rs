//! The connected session of a non-OAuth scenario and how calls go through
//! it, answering `input_required` rounds (SEP-2322) in the stateless
//! revision.

use std::time::Duration;

use anyhow::{Context, bail};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, GetPromptRequestParams,
    GetPromptResponse, InputRequest, InputRequiredResult, InputResponses, JsonObject,
    ReadResourceRequestParams, ReadResourceResponse,
};
use serde_json::{Value, json};

use crate::upstream::{CallOutcome, CallRequest, Session};

/// Bound on each tool call (the suite gives a whole scenario 20 s by default).
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// Most `input_required` rounds driven for one request.
const MAX_INPUT_ROUNDS: usize = 8;

/// The connected session, and how to call through it.
pub(super) struct Client<'a> {
    pub(super) session: &'a Session,
    pub(super) stateless: bool,
}

impl Client<'_> {
    /// Calls `tool`: stateful, through the gateway's [`Session::call`];
    /// stateless, over the session's peer, answering `input_required`
    /// rounds (which the gateway's calls refuse).
    pub(super) async fn call(
        &self,
        tool: &str,
        arguments: JsonObject,
    ) -> anyhow::Result<CallToolResult> {
        let shown = Value::Object(arguments.clone());
        tracing::info!(tool, arguments = %shown, "tools/call");
        let result = if self.stateless {
            self.call_answering(tool, arguments).await?
        } else {
            let request = CallRequest::new(tool, arguments, CALL_TIMEOUT);
            match self
                .session
                .call(&request)
                .await
                .with_context(|| format!("tools/call {tool}"))?
            {
                CallOutcome::Complete(result) => result,
                CallOutcome::InputRequired(_) => {
                    bail!("tools/call {tool}: the server asked for input on a stateful session")
                }
                CallOutcome::Task(_) => bail!("tools/call {tool}: unsupported result (a task)"),
            }
        };
        tracing::info!(
            tool,
            result = %serde_json::to_string(&result).unwrap_or_default(),
            "tools/call result"
        );
        Ok(result)
    }

    async fn call_answering(
        &self,
        tool: &str,
        arguments: JsonObject,
    ) -> anyhow::Result<CallToolResult> {
        let peer = self.session.hold().await?;
        let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        for _ in 0..=MAX_INPUT_ROUNDS {
            let response = tokio::time::timeout(CALL_TIMEOUT, peer.call_tool_once(params.clone()))
                .await
                .with_context(|| format!("tools/call {tool}: no answer in time"))?
                .with_context(|| format!("tools/call {tool}"))?;
            match response {
                CallToolResponse::Complete(result) => return Ok(result),
                CallToolResponse::InputRequired(input) => {
                    (params.input_responses, params.request_state) = answer(input)?;
                }
                _ => bail!("tools/call {tool}: unsupported result (a task)"),
            }
        }
        bail!("tools/call {tool}: more than {MAX_INPUT_ROUNDS} input_required rounds")
    }

    /// `resources/list`, then `resources/read` of each (stateless only).
    pub(super) async fn read_every_resource(&self) -> anyhow::Result<()> {
        let peer = self.session.hold().await?;
        let resources = peer.list_all_resources().await.context("resources/list")?;
        for resource in resources {
            let uri = resource.uri.clone();
            tracing::info!(%uri, "resources/read");
            let params = ReadResourceRequestParams::new(uri.clone());
            answering(&format!("resources/read {uri}"), params, |params| async {
                peer.read_resource_once(params).await.map(Round::from)
            })
            .await?;
        }
        Ok(())
    }

    /// Loads every skill the server lists, as `GetSkill` would from the
    /// listed entry: `SKILL.md` read and verified (size, digest,
    /// frontmatter), and only a verified skill's other files read, each
    /// verified too. A skill that fails verification is rejected (logged),
    /// not an error of the flow.
    pub(super) async fn load_every_skill(&self) -> anyhow::Result<()> {
        use crate::upstream::skills::{SkillResources, verify, verify_frontmatter};
        let skills = match self.session.list_skills(8, CALL_TIMEOUT).await {
            Some(listed) => listed.map_err(|e| anyhow::anyhow!(e))?,
            None => bail!("the session offers no skills"),
        };
        for skill in skills {
            let SkillResources::Files(files) = &skill.resources else {
                tracing::info!(uri = %skill.uri, "a dynamic skill: nothing to verify, not loaded");
                continue;
            };
            let mut files = files.clone();
            files.sort_by_key(|f| f.uri != skill.uri);
            for listed in &files {
                let file = self
                    .session
                    .read_skill_file(&listed.uri, CALL_TIMEOUT)
                    .await
                    .with_context(|| format!("resources/read {}", listed.uri))?;
                let checked = verify(&file, listed).and_then(|()| {
                    if listed.uri == skill.uri {
                        verify_frontmatter(file.content.bytes(), &skill)
                    } else {
                        Ok(())
                    }
                });
                if let Err(mismatch) = checked {
                    tracing::warn!(uri = %listed.uri, %mismatch, "skill rejected: it fails verification");
                    break;
                }
                tracing::info!(uri = %listed.uri, "skill file verified");
            }
        }
        Ok(())
    }

    /// `prompts/list`, then `prompts/get` of each (stateless only).
    pub(super) async fn get_every_prompt(&self) -> anyhow::Result<()> {
        let peer = self.session.hold().await?;
        let prompts = peer.list_all_prompts().await.context("prompts/list")?;
        for prompt in prompts {
            let name = prompt.name.clone();
            tracing::info!(%name, "prompts/get");
            let mut params = GetPromptRequestParams::new(name.clone());
            params.arguments = Some(JsonObject::new());
            answering(&format!("prompts/get {name}"), params, |params| async {
                peer.get_prompt_once(params).await.map(Round::from)
            })
            .await?;
        }
        Ok(())
    }
}

/// What one round of a request (other than `tools/call`) came back with.
enum Round {
    /// The request completed.
    Done,
    /// The server asks for input first (SEP-2322).
    Input(InputRequiredResult),
    /// Anything else (a task).
    Other,
}

impl From<ReadResourceResponse> for Round {
    fn from(response: ReadResourceResponse) -> Self {
        match response {
            ReadResourceResponse::Complete(_) => Round::Done,
            ReadResourceResponse::InputRequired(input) => Round::Input(input),
            _ => Round::Other,
        }
    }
}

impl From<GetPromptResponse> for Round {
    fn from(response: GetPromptResponse) -> Self {
        match response {
            GetPromptResponse::Complete(_) => Round::Done,
            GetPromptResponse::InputRequired(input) => Round::Input(input),
            _ => Round::Other,
        }
    }
}

/// The parameters of a request that can be answered `input_required`.
trait Answerable: Clone {
    /// Sets what the retry carries.
    fn answered(&mut self, responses: Option<InputResponses>, state: Option<String>);
}

impl Answerable for ReadResourceRequestParams {
    fn answered(&mut self, responses: Option<InputResponses>, state: Option<String>) {
        (self.input_responses, self.request_state) = (responses, state);
    }
}

impl Answerable for GetPromptRequestParams {
    fn answered(&mut self, responses: Option<InputResponses>, state: Option<String>) {
        (self.input_responses, self.request_state) = (responses, state);
    }
}

/// Sends `params` with `send` until the request completes, answering at
/// most [`MAX_INPUT_ROUNDS`] `input_required` rounds; `what` names the
/// request in errors.
async fn answering<P, F, Fut>(what: &str, mut params: P, send: F) -> anyhow::Result<()>
where
    P: Answerable,
    F: Fn(P) -> Fut,
    Fut: Future<Output = Result<Round, rmcp::ServiceError>>,
{
    let mut rounds = 0;
    loop {
        match send(params.clone()).await {
            Ok(Round::Done) => return Ok(()),
            Ok(Round::Input(input)) if rounds < MAX_INPUT_ROUNDS => {
                rounds += 1;
                let (responses, state) = answer(input)?;
                params.answered(responses, state);
            }
            Ok(_) => bail!("{what}: too many input_required rounds"),
            Err(e) => return Err(e).context(what.to_owned()),
        }
    }
}

/// Answers every input request of an `input_required` result (SEP-2322) and
/// returns what the retry carries: the responses (none when nothing was
/// asked) and the server's `requestState`, echoed untouched (absent when the
/// server sent none).
fn answer(input: InputRequiredResult) -> anyhow::Result<(Option<InputResponses>, Option<String>)> {
    let requests = input.input_requests.unwrap_or_default();
    if requests.is_empty() && input.request_state.is_none() {
        bail!("an input_required result with neither inputRequests nor requestState");
    }
    let mut responses = InputResponses::new();
    for (key, request) in requests {
        let response = match request {
            InputRequest::Elicitation(request) => {
                serde_json::to_value(super::defaults::accept_with_defaults(&request.params))?
            }
            InputRequest::ListRoots(_) => json!({ "roots": [] }),
            InputRequest::CreateMessage(_) => {
                bail!("input request `{key}`: sampling is not supported")
            }
            _ => bail!("input request `{key}`: unsupported kind"),
        };
        tracing::info!(%key, %response, "answering input request");
        responses.insert(key, response);
    }
    Ok((
        (!responses.is_empty()).then_some(responses),
        input.request_state,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input_required(value: Value) -> InputRequiredResult {
        serde_json::from_value(value).expect("an input_required result")
    }

    #[test]
    fn elicitations_are_accepted_with_defaults_and_state_is_echoed() {
        let input = input_required(json!({
            "resultType": "input_required",
            "inputRequests": {"confirm": {"method": "elicitation/create", "params": {
                "mode": "form",
                "message": "?",
                "requestedSchema": {"type": "object", "properties": {
                    "name": {"type": "string", "default": "Ada"},
                    "age": {"type": "integer", "default": 36},
                    "ok": {"type": "boolean"},
                    "note": {"type": "string"}
                }}
            }}},
            "requestState": "opaque-state"
        }));
        let (responses, state) = answer(input).expect("answered");
        assert_eq!(state.as_deref(), Some("opaque-state"));
        assert_eq!(
            responses.expect("responses")["confirm"],
            json!({"action": "accept", "content": {
                "name": "Ada", "age": 36, "ok": true, "note": "conformance"
            }})
        );
    }

    #[test]
    fn no_request_state_is_invented() {
        let input = input_required(json!({
            "resultType": "input_required",
            "inputRequests": {"c": {"method": "elicitation/create", "params": {
                "message": "?",
                "requestedSchema": {"type": "object", "properties": {}}
            }}}
        }));
        let (responses, state) = answer(input).expect("answered");
        assert!(state.is_none());
        assert!(responses.is_some());
    }
}
