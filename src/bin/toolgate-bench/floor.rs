//! The floor of a gRPC hop: a bare tonic server of the same service and
//! message types that answers every call with a prebuilt message, no work.

use std::sync::Arc;

use tonic::{Request, Response, Status};
use toolgate::pb;

type Stream<T> = std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>>;

/// Answers InvokeTool with the argument text; ListTools with a prebuilt
/// message of a chosen size.
#[derive(Clone)]
pub struct Echo {
    list: Arc<pb::ListToolsResponse>,
}

impl Echo {
    pub fn new(list_bytes: usize) -> Self {
        let list = pb::ListToolsResponse {
            catalog_version: "x".repeat(list_bytes),
            ..Default::default()
        };
        Self {
            list: Arc::new(list),
        }
    }
}

#[tonic::async_trait]
impl pb::tool_gateway_server::ToolGateway for Echo {
    async fn list_tools(
        &self,
        _request: Request<pb::ListToolsRequest>,
    ) -> Result<Response<pb::ListToolsResponse>, Status> {
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

    type WatchToolsStream = Stream<pb::ListToolsResponse>;

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
}

/// Serves the floor on 127.0.0.1:`port`.
pub async fn serve(port: u16, list_bytes: usize) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    tonic::transport::Server::builder()
        .add_service(
            pb::tool_gateway_server::ToolGatewayServer::new(Echo::new(list_bytes))
                .max_encoding_message_size(usize::MAX),
        )
        .serve_with_incoming(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
        )
        .await?;
    Ok(())
}
