//! The floor of a gRPC hop: a bare tonic server of the same service and
//! message types that answers every call with a prebuilt message, no work:
//! InvokeTool with the argument text, ListTools with bytes recorded from a
//! gateway's answer, written as they are (what the gateway does with the
//! tools it encoded ahead).

use std::sync::Arc;

use tonic::{Request, Response, Status};
use toolgate::grpc::reply::{EncodedTools, ListToolsReply};
use toolgate::pb;

type Stream<T> = std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>>;

/// Answers InvokeTool with the argument text; ListTools with a recorded
/// answer.
#[derive(Clone)]
pub struct Echo {
    list: Arc<ListToolsReply>,
}

impl Echo {
    /// `list`: the encoded ListToolsResponse to answer (empty: an empty
    /// listing).
    pub fn new(list: &[u8]) -> anyhow::Result<Self> {
        let message = <pb::ListToolsResponse as prost::Message>::decode(list)?;
        // The tools as one encoded block and the rest per call: byte for
        // byte what a gateway answers.
        let tools = EncodedTools::encode(message.tools.clone());
        let reply = ListToolsReply::encoded(tools, message);
        anyhow::ensure!(
            prost::Message::encode_to_vec(&reply) == list,
            "the recorded ListTools answer does not re-encode to the same bytes"
        );
        Ok(Self {
            list: Arc::new(reply),
        })
    }
}

#[tonic::async_trait]
impl toolgate::grpc::server::tool_gateway_server::ToolGateway for Echo {
    async fn list_tools(
        &self,
        _request: Request<pb::ListToolsRequest>,
    ) -> Result<Response<ListToolsReply>, Status> {
        Ok(Response::new((*self.list).clone()))
    }

    async fn invoke_tool(
        &self,
        request: Request<pb::InvokeToolRequest>,
    ) -> Result<Response<pb::InvokeToolResponse>, Status> {
        let request = request.into_inner();
        Ok(Response::new(pb::InvokeToolResponse {
            text: request.arguments_json,
            content: vec![pb::Content {
                kind: Some(pb::content::Kind::Text(pb::TextContent {
                    text: request.name,
                })),
            }],
            ..Default::default()
        }))
    }

    type InvokeToolStreamStream = Stream<pb::InvokeToolEvent>;

    async fn invoke_tool_stream(
        &self,
        _request: Request<pb::InvokeToolRequest>,
    ) -> Result<Response<Self::InvokeToolStreamStream>, Status> {
        Err(Status::unimplemented("not in the floor"))
    }

    type WatchToolsStream = Stream<ListToolsReply>;

    async fn watch_tools(
        &self,
        _request: Request<pb::WatchToolsRequest>,
    ) -> Result<Response<Self::WatchToolsStream>, Status> {
        Err(Status::unimplemented("not in the floor"))
    }

    async fn search_tools(
        &self,
        _request: Request<pb::SearchToolsRequest>,
    ) -> Result<Response<pb::SearchToolsResponse>, Status> {
        Err(Status::unimplemented("not in the floor"))
    }

    async fn complete_authorization(
        &self,
        _request: Request<pb::CompleteAuthorizationRequest>,
    ) -> Result<Response<pb::CompleteAuthorizationResponse>, Status> {
        Err(Status::unimplemented("not in the floor"))
    }

    type InvokeToolInteractiveStream = Stream<pb::InvokeToolEvent>;

    async fn invoke_tool_interactive(
        &self,
        _request: Request<tonic::Streaming<pb::InteractiveRequest>>,
    ) -> Result<Response<Self::InvokeToolInteractiveStream>, Status> {
        Err(Status::unimplemented("not in the floor"))
    }

    async fn get_task(
        &self,
        _request: Request<pb::GetTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        Err(Status::unimplemented("not in the floor"))
    }

    async fn update_task(
        &self,
        _request: Request<pb::UpdateTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        Err(Status::unimplemented("not in the floor"))
    }

    async fn cancel_task(
        &self,
        _request: Request<pb::CancelTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        Err(Status::unimplemented("not in the floor"))
    }
    async fn list_resources(
        &self,
        _request: Request<pb::ListResourcesRequest>,
    ) -> Result<Response<pb::ListResourcesResponse>, Status> {
        Err(Status::unimplemented("not in the floor"))
    }

    async fn read_resource(
        &self,
        _request: Request<pb::ReadResourceRequest>,
    ) -> Result<Response<pb::ReadResourceResponse>, Status> {
        Err(Status::unimplemented("not in the floor"))
    }

    type WatchResourceStream = Stream<pb::ResourceUpdate>;

    async fn watch_resource(
        &self,
        _request: Request<pb::WatchResourceRequest>,
    ) -> Result<Response<Self::WatchResourceStream>, Status> {
        Err(Status::unimplemented("not in the floor"))
    }

    async fn list_prompts(
        &self,
        _request: Request<pb::ListPromptsRequest>,
    ) -> Result<Response<pb::ListPromptsResponse>, Status> {
        Err(Status::unimplemented("not in the floor"))
    }

    async fn get_prompt(
        &self,
        _request: Request<pb::GetPromptRequest>,
    ) -> Result<Response<pb::GetPromptResponse>, Status> {
        Err(Status::unimplemented("not in the floor"))
    }

    async fn complete(
        &self,
        _request: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResponse>, Status> {
        Err(Status::unimplemented("not in the floor"))
    }

    async fn list_skills(
        &self,
        _request: Request<pb::ListSkillsRequest>,
    ) -> Result<Response<pb::ListSkillsResponse>, Status> {
        Err(Status::unimplemented("not in the floor"))
    }

    async fn get_skill(
        &self,
        _request: Request<pb::GetSkillRequest>,
    ) -> Result<Response<pb::GetSkillResponse>, Status> {
        Err(Status::unimplemented("not in the floor"))
    }
}

/// Serves the floor on 127.0.0.1:`port`; ListTools answers the encoded
/// message in the file `list` (none: an empty listing).
pub async fn serve(port: u16, list: Option<&std::path::Path>) -> anyhow::Result<()> {
    let list = match list {
        Some(path) => std::fs::read(path)?,
        None => Vec::new(),
    };
    let echo = Echo::new(&list)?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    tonic::transport::Server::builder()
        .add_service(
            toolgate::grpc::server::tool_gateway_server::ToolGatewayServer::new(echo)
                .max_encoding_message_size(usize::MAX),
        )
        .serve_with_incoming(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
        )
        .await?;
    Ok(())
}
