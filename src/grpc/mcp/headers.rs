//! The routing headers the transport asks clients to send (`mcp_tool` on
//! CallTool, `mcp_prompt` on GetPrompt, `mcp_resource` on ReadResource and
//! Complete), so that a mesh can route and authorize on them: each value
//! given must name exactly what the request's body names, or the request
//! is refused (`ROUTING_HEADER_MISMATCH`) before anything runs. A request
//! without the header is served: nothing routed on it.

use tonic::metadata::MetadataMap;

use crate::calls::CallError;
use crate::calls::error::MAX_TARGET_NAME;

/// CallTool's header: the tool's name.
pub(super) const TOOL: &str = "mcp_tool";
/// GetPrompt's header: the prompt's name.
pub(super) const PROMPT: &str = "mcp_prompt";
/// ReadResource's header (the URI), and Complete's (the prompt's name or
/// the resource's URI).
pub(super) const RESOURCE: &str = "mcp_resource";

/// Checks every value of `header` against `named`.
///
/// # Errors
/// `ROUTING_HEADER_MISMATCH` naming the header and both values.
pub(super) fn check(
    metadata: &MetadataMap,
    header: &'static str,
    named: &str,
) -> Result<(), CallError> {
    for value in metadata.get_all(header) {
        if value.as_bytes() != named.as_bytes() {
            let cut = |text: &str| crate::upstream::truncate(text, MAX_TARGET_NAME);
            return Err(CallError::RoutingHeaderMismatch {
                header,
                header_value: cut(&String::from_utf8_lossy(value.as_bytes())),
                request_value: cut(named),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_must_name_the_request() {
        let mut metadata = MetadataMap::new();
        assert!(check(&metadata, TOOL, "a__b").is_ok());
        metadata.insert(TOOL, "a__b".parse().unwrap());
        assert!(check(&metadata, TOOL, "a__b").is_ok());
        assert!(check(&metadata, TOOL, "a__c").is_err());
        metadata.append(TOOL, "x__y".parse().unwrap());
        let error = check(&metadata, TOOL, "a__b").unwrap_err();
        assert!(error.to_string().contains("`x__y`"), "{error}");
    }
}
