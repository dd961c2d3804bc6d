//! The address rule: which endpoints the gateway may call (token,
//! registration, the IdP's), by the class of the addresses they resolve to.

use std::net::IpAddr;

use url::Url;

use super::OAuthError;

/// Refuses an endpoint the gateway would call (token, registration, the
/// IdP's) that resolves to a private or loopback address, unless
/// `allow_private`; link-local, unspecified, multicast and broadcast
/// addresses always. A name that does not resolve is left to the request
/// itself to fail.
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
    for ip in addresses {
        match classify(ip) {
            AddressClass::Public => {}
            AddressClass::Private if allow_private => {}
            AddressClass::Private | AddressClass::Reserved => {
                return Err(OAuthError::ForbiddenAddress(shown()));
            }
        }
    }
    Ok(())
}

#[derive(Debug, PartialEq, Eq)]
pub(in crate::credentials) enum AddressClass {
    Public,
    /// Private, loopback, shared (CGNAT) or unique-local.
    Private,
    /// Link-local, unspecified, multicast, broadcast, documentation.
    Reserved,
}

pub(in crate::credentials) fn classify(ip: IpAddr) -> AddressClass {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            if v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || a == 0
            {
                AddressClass::Reserved
            } else if v4.is_private() || v4.is_loopback() || (a == 100 && (64..128).contains(&b)) {
                AddressClass::Private
            } else {
                AddressClass::Public
            }
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return classify(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            if v6.is_unspecified() || v6.is_multicast() || (first & 0xffc0) == 0xfe80 {
                AddressClass::Reserved
            } else if v6.is_loopback() || (first & 0xfe00) == 0xfc00 {
                AddressClass::Private
            } else {
                AddressClass::Public
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_classified() {
        let class = |s: &str| classify(s.parse().expect("an address"));
        assert_eq!(class("8.8.8.8"), AddressClass::Public);
        assert_eq!(class("10.1.2.3"), AddressClass::Private);
        assert_eq!(class("127.0.0.1"), AddressClass::Private);
        assert_eq!(class("100.64.0.1"), AddressClass::Private);
        assert_eq!(class("169.254.169.254"), AddressClass::Reserved);
        assert_eq!(class("0.0.0.0"), AddressClass::Reserved);
        assert_eq!(class("::1"), AddressClass::Private);
        assert_eq!(class("fd00::1"), AddressClass::Private);
        assert_eq!(class("fe80::1"), AddressClass::Reserved);
        assert_eq!(class("::ffff:169.254.1.1"), AddressClass::Reserved);
        assert_eq!(class("2001:4860::8888"), AddressClass::Public);
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
