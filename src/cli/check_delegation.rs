//! `toolgate check`: each delegated server (`grant: token_exchange`,
//! `grant: identity_assertion`), its grant and where it exchanges the
//! caller's JWT, as configured (offline); the online check adds the
//! endpoints discovery resolves (`OAuthClient::describe_delegation`).

use crate::config::{Config, Grant, ServerConfig, ServerOAuth, Transport};

/// Prints a line per delegated server of the configuration's tenants.
pub(super) fn check_delegated_servers(config: &Config) {
    for tenant in &config.tenants {
        for server in &tenant.servers {
            if let Some(line) = configured(server) {
                println!("tenant {} server {}: {line}", tenant.name, server.name);
            }
        }
    }
}

/// What the configuration says of `server`'s delegation, if it has one.
fn configured(server: &ServerConfig) -> Option<String> {
    let oauth = server.oauth.as_ref().filter(|o| o.delegated())?;
    let url = match &server.transport {
        Transport::Http { url, .. } => url.as_str(),
        _ => "",
    };
    Some(describe(oauth, url))
}

/// The grant of `oauth` and where it exchanges, for the server at `url`.
fn describe(oauth: &ServerOAuth, url: &str) -> String {
    match (oauth.grant, &oauth.identity_provider) {
        (Grant::IdentityAssertion, Some(idp)) => format!(
            "grant identity_assertion: the caller's ID token of {} exchanged for an ID-JAG at {}, \
             then at the server's authorization server (discovered from {url})",
            idp.issuer,
            idp.token_endpoint.as_ref().map_or_else(
                || format!("its token endpoint (discovered from {})", idp.issuer),
                ToString::to_string
            )
        ),
        (grant, _) => {
            let whose = if oauth.subject_issuers.is_empty() {
                String::new()
            } else {
                format!(" (JWTs of {} only)", oauth.subject_issuers.join(", "))
            };
            format!(
                "grant {grant}: the caller's JWT exchanged at {}{whose}",
                oauth.token_endpoint.as_ref().map_or_else(
                    || format!(
                        "its own issuer's token endpoint, only when {url} names that issuer as \
                         its authorization server"
                    ),
                    ToString::to_string
                )
            )
        }
    }
}
