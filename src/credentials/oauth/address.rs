//! Which endpoints the gateway may call (token, registration, the IdP's),
//! by the class of the addresses they resolve to: the address rule of
//! [`crate::config::address`], with `oauth.allow_private_addresses`.

use std::net::IpAddr;

use url::Url;

use super::OAuthError;
use crate::config::address::allowed;

/// Refuses an endpoint the gateway would call (token, registration, the
/// IdP's) that resolves to an address the address rule refuses, for a clear
/// error before the flow starts. It is a check ahead, not the guard: every
/// OAuth request goes through [`crate::credentials::dpop::OAuthHttp`],
/// whose resolver applies the same rule to each address of each
/// connection (a name that resolves differently later is refused then).
/// A name that does not resolve is left to the request itself to fail.
pub(super) async fn check_endpoint(endpoint: &str, allow_private: bool) -> Result<(), OAuthError> {
    let url = Url::parse(endpoint)
        .map_err(|_| OAuthError::Discovery("an endpoint is not a URL".into()))?;
    let shown = || {
        let mut shown = url.clone();
        shown.set_query(None);
        shown.to_string()
    };
    if !matches!(url.scheme(), "http" | "https") {
        return Err(OAuthError::Discovery(format!(
            "endpoint {} is not http(s)",
            shown()
        )));
    }
    let addresses: Vec<IpAddr> = match url.host() {
        Some(url::Host::Ipv4(ip)) => vec![IpAddr::V4(ip)],
        Some(url::Host::Ipv6(ip)) => vec![IpAddr::V6(ip)],
        Some(url::Host::Domain(name)) => {
            let port = url.port_or_known_default().unwrap_or(443);
            match tokio::net::lookup_host((name, port)).await {
                Ok(found) => found.map(|a| a.ip()).collect(),
                Err(_) => return Ok(()),
            }
        }
        None => return Err(OAuthError::Discovery("an endpoint has no host".into())),
    };
    if addresses.into_iter().all(|ip| allowed(ip, allow_private)) {
        Ok(())
    } else {
        Err(OAuthError::ForbiddenAddress(shown()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::address::tests::{ALWAYS_REFUSED, PRIVATE};

    #[tokio::test]
    async fn check_endpoint_refuses_every_form() {
        for text in ALWAYS_REFUSED.iter().chain(PRIVATE.iter()) {
            let ip: IpAddr = text.parse().expect("an address");
            let host = match ip {
                IpAddr::V4(v4) => v4.to_string(),
                IpAddr::V6(v6) => format!("[{v6}]"),
            };
            let url = format!("https://{host}/token");
            assert!(
                matches!(
                    check_endpoint(&url, false).await,
                    Err(OAuthError::ForbiddenAddress(_))
                ),
                "{url}"
            );
        }
    }

    #[tokio::test]
    async fn private_endpoints_need_the_setting() {
        let token = "http://127.0.0.1:9/token";
        assert!(matches!(
            check_endpoint(token, false).await,
            Err(OAuthError::ForbiddenAddress(_))
        ));
        assert!(check_endpoint(token, true).await.is_ok());
        assert!(matches!(
            check_endpoint("http://169.254.169.254/token", true).await,
            Err(OAuthError::ForbiddenAddress(_))
        ));
    }
}
