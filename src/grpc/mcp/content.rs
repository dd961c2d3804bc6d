//! A server's content blocks, resources and annotations as the transport's
//! messages. Base64 (images, audio, blobs) is decoded to bytes; every
//! resource (a link, an embedded resource, a listed resource or template)
//! carries the name of the server it came from in its metadata under
//! [`SERVER_KEY`], which a `ReadResource` or `Complete` may pass back to
//! say which server it means.

use rmcp::model::{Annotations, ContentBlock, MetaObject, ResourceContents, Role};

use super::structs;
use crate::grpc::convert::{self, InvalidContent};
use crate::pb::mcp;
use crate::policy::ResourceUri;

/// The `_meta` key that names a resource's server (in listings, links and
/// embedded resources; and in a request's `common.metadata`).
pub(super) const SERVER_KEY: &str = "toolgate/server";

/// A metadata Struct holding `meta` (if any) and, when given, the server.
pub(super) fn metadata(
    meta: Option<MetaObject>,
    server: Option<&str>,
) -> Option<prost_types::Struct> {
    let mut object = meta.map(|m| m.0).unwrap_or_default();
    if let Some(server) = server {
        object.insert(SERVER_KEY.to_owned(), server.into());
    }
    (!object.is_empty()).then(|| structs::to_struct(object))
}

/// The transport's role.
pub(super) fn role(role: &Role) -> i32 {
    match role {
        Role::User => mcp::Role::User.into(),
        Role::Assistant => mcp::Role::Assistant.into(),
    }
}

/// The transport's annotations.
pub(super) fn annotations(annotations: Option<Annotations>) -> Option<mcp::Annotations> {
    annotations.map(|a| mcp::Annotations {
        audience: a.audience.iter().flatten().map(role).collect(),
        priority: a.priority,
        last_modified: a.last_modified,
    })
}

/// One block of a result or a prompt message, in the transport's kinds.
pub(super) enum Block {
    Text(mcp::TextContent),
    Image(mcp::ImageContent),
    Audio(mcp::AudioContent),
    Embedded(mcp::EmbeddedResource),
    Link(mcp::Resource),
}

/// A content block of `server`'s.
///
/// # Errors
/// Base64 that does not decode.
pub(super) fn block(content: ContentBlock, server: &str) -> Result<Block, InvalidContent> {
    Ok(match content {
        ContentBlock::Text(t) => Block::Text(mcp::TextContent {
            text: t.text,
            annotations: annotations(t.annotations),
            metadata: metadata(t.meta, None),
        }),
        ContentBlock::Image(i) => Block::Image(mcp::ImageContent {
            data: convert::decode(&i.data, "an image")?,
            mime_type: i.mime_type,
            annotations: annotations(i.annotations),
            metadata: metadata(i.meta, None),
        }),
        ContentBlock::Audio(a) => Block::Audio(mcp::AudioContent {
            data: convert::decode(&a.data, "audio")?,
            mime_type: a.mime_type,
            annotations: annotations(a.annotations),
            metadata: metadata(a.meta, None),
        }),
        ContentBlock::Resource(r) => Block::Embedded(mcp::EmbeddedResource {
            contents: Some(contents(r.resource)?),
            annotations: annotations(r.annotations),
            metadata: metadata(r.meta, Some(server)),
        }),
        ContentBlock::ResourceLink(r) => Block::Link(mcp::Resource {
            // In normal form, as a read of it is matched and sent.
            uri: ResourceUri::parse(&r.uri).map_or(r.uri, ResourceUri::into_string),
            name: r.name,
            title: r.title.unwrap_or_default(),
            description: r.description.unwrap_or_default(),
            mime_type: r.mime_type.unwrap_or_default(),
            annotations: annotations(r.annotations),
            size: r.size.unwrap_or_default(),
            icons: Vec::new(),
            metadata: metadata(r.meta, Some(server)),
        }),
        // Content kinds added to MCP after this gateway was built are
        // carried as their JSON text rather than dropped.
        #[allow(unreachable_patterns)]
        other => Block::Text(mcp::TextContent {
            text: serde_json::to_string(&other).unwrap_or_default(),
            ..Default::default()
        }),
    })
}

/// A block as one of a tool result's contents.
pub(super) fn tool_content(block: Block) -> mcp::call_tool_response::Content {
    let mut content = mcp::call_tool_response::Content::default();
    match block {
        Block::Text(t) => content.text = Some(t),
        Block::Image(i) => content.image = Some(i),
        Block::Audio(a) => content.audio = Some(a),
        Block::Embedded(e) => content.embedded_resource = Some(e),
        Block::Link(l) => content.resource_link = Some(l),
    }
    content
}

/// A block as a prompt message of `role`.
pub(super) fn prompt_message(role: &Role, block: Block) -> mcp::PromptMessage {
    let mut message = mcp::PromptMessage {
        role: self::role(role),
        ..Default::default()
    };
    match block {
        Block::Text(t) => message.text = Some(t),
        Block::Image(i) => message.image = Some(i),
        Block::Audio(a) => message.audio = Some(a),
        Block::Embedded(e) => message.embedded_resource = Some(e),
        Block::Link(l) => message.resource_link = Some(l),
    }
    message
}

/// A resource's contents: text as it came, a blob decoded.
///
/// # Errors
/// A blob that is not base64.
pub(super) fn contents(
    contents: ResourceContents,
) -> Result<mcp::ResourceContents, InvalidContent> {
    Ok(match contents {
        ResourceContents::TextResourceContents {
            uri,
            mime_type,
            text,
            meta,
        } => mcp::ResourceContents {
            uri,
            mime_type: mime_type.unwrap_or_default(),
            text,
            blob: Vec::new(),
            metadata: metadata(meta, None),
        },
        ResourceContents::BlobResourceContents {
            uri,
            mime_type,
            blob,
            meta,
        } => mcp::ResourceContents {
            uri,
            mime_type: mime_type.unwrap_or_default(),
            text: String::new(),
            blob: convert::decode(&blob, "a resource blob")?,
            metadata: metadata(meta, None),
        },
        // Kinds of contents added to MCP after this gateway was built are
        // carried as their JSON text.
        #[allow(unreachable_patterns)]
        other => mcp::ResourceContents {
            mime_type: "application/json".to_owned(),
            text: serde_json::to_string(&other).unwrap_or_default(),
            ..Default::default()
        },
    })
}
