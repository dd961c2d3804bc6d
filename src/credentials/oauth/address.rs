//! The address rule: which endpoints the gateway may call (token,
//! registration, the IdP's), by the class of the addresses they resolve to.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use url::Url;

use super::OAuthError;

/// Refuses an endpoint the gateway would call (token, registration, the
/// IdP's) that resolves to an address [`allowed`] refuses, for a clear
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

/// Whether `ip` passes the address rule: public always, private and
/// loopback only with `allow_private`, reserved never. The one rule every
/// OAuth request's resolved addresses go through (here and in
/// [`crate::credentials::dpop::OAuthHttp`]'s resolver).
pub(in crate::credentials) fn allowed(ip: IpAddr, allow_private: bool) -> bool {
    match classify(ip) {
        AddressClass::Public => true,
        AddressClass::Private => allow_private,
        AddressClass::Reserved => false,
    }
}

#[derive(Debug, PartialEq, Eq)]
pub(in crate::credentials) enum AddressClass {
    Public,
    /// Private, loopback, shared (CGNAT) or unique-local.
    Private,
    /// Link-local, unspecified, multicast, broadcast, documentation,
    /// benchmarking, reserved, and cloud metadata services (on any of
    /// these, even with `allow_private_addresses`).
    Reserved,
}

/// Cloud instance metadata services outside the link-local ranges:
/// Alibaba Cloud's `100.100.100.200` (inside the shared 100.64/10) and
/// Azure's wire server `168.63.129.16`.
const METADATA_V4: [Ipv4Addr; 2] = [
    Ipv4Addr::new(100, 100, 100, 200),
    Ipv4Addr::new(168, 63, 129, 16),
];

/// AWS's instance metadata service over IPv6 (`fd00:ec2::254`, inside the
/// unique-local fc00::/7).
const METADATA_V6: [Ipv6Addr; 1] = [Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)];

/// The class of `ip`. An IPv6 address that carries an IPv4 one (mapped,
/// compatible, NAT64, 6to4, Teredo) has the stricter class of the two
/// readings: what a translator or relay on the path would reach.
pub(in crate::credentials) fn classify(ip: IpAddr) -> AddressClass {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => {
            let own = classify_v6(v6);
            match embedded_v4(v6) {
                Some(v4) => stricter(own, classify_v4(v4)),
                None => own,
            }
        }
    }
}

fn classify_v4(v4: Ipv4Addr) -> AddressClass {
    let [a, b, c, _] = v4.octets();
    if v4.is_link_local()
        || v4.is_unspecified()
        || v4.is_multicast()
        || v4.is_broadcast()
        || v4.is_documentation()
        || METADATA_V4.contains(&v4)
        || a == 0
        || a >= 240
        || (a == 192 && b == 0 && c == 0)
        || (a == 198 && (18..20).contains(&b))
    {
        AddressClass::Reserved
    } else if v4.is_private() || v4.is_loopback() || (a == 100 && (64..128).contains(&b)) {
        AddressClass::Private
    } else {
        AddressClass::Public
    }
}

fn classify_v6(v6: Ipv6Addr) -> AddressClass {
    let s = v6.segments();
    if v6.is_unspecified()
        || v6.is_multicast()
        || METADATA_V6.contains(&v6)
        || (s[0] & 0xffc0) == 0xfe80
        || (s[0] & 0xffc0) == 0xfec0
        || (s[0] == 0x2001 && s[1] == 0x0db8)
        || (s[0] == 0x0100 && s[1..4] == [0, 0, 0])
    {
        AddressClass::Reserved
    } else if v6.is_loopback() || (s[0] & 0xfe00) == 0xfc00 {
        AddressClass::Private
    } else {
        AddressClass::Public
    }
}

/// The IPv4 address an IPv6 one carries: IPv4-mapped (`::ffff:0:0/96`),
/// IPv4-compatible (`::/96`, not `::` or `::1`), NAT64 (`64:ff9b::/96`,
/// `64:ff9b:1::/48`), 6to4 (`2002::/16`) and Teredo (`2001::/32`, the
/// client's address).
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let low = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    if s[..6] == [0; 6] && !v6.is_unspecified() && !v6.is_loopback() {
        return Some(low(s[6], s[7]));
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1) {
        return Some(low(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        return Some(low(s[1], s[2]));
    }
    if s[0] == 0x2001 && s[1] == 0 {
        return Some(low(!s[6], !s[7]));
    }
    None
}

fn stricter(a: AddressClass, b: AddressClass) -> AddressClass {
    use AddressClass::{Private, Public, Reserved};
    match (a, b) {
        (Reserved, _) | (_, Reserved) => Reserved,
        (Private, _) | (_, Private) => Private,
        (Public, Public) => Public,
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

    /// Addresses no OAuth request may reach, even with
    /// `allow_private_addresses`: cloud metadata services, and the
    /// metadata and private addresses carried inside IPv6 ones.
    const ALWAYS_REFUSED: [&str; 14] = [
        "169.254.169.254",
        "100.100.100.200",
        "168.63.129.16",
        "fd00:ec2::254",
        "::ffff:169.254.169.254",
        "::169.254.169.254",
        "64:ff9b::169.254.169.254",
        "64:ff9b:1::a9fe:a9fe",
        "2002:a9fe:a9fe::1",
        "2001:0:4136:e378:8000:63bf:5601:5601",
        "::ffff:100.100.100.200",
        "64:ff9b::100.100.100.200",
        "2002:6464:64c8::",
        "240.0.0.1",
    ];

    /// Private addresses, also in IPv6 forms: refused unless
    /// `allow_private_addresses`.
    const PRIVATE: [&str; 7] = [
        "10.0.0.1",
        "::ffff:10.0.0.1",
        "::10.0.0.1",
        "64:ff9b::10.0.0.1",
        "64:ff9b:1::a00:1",
        "2002:a00:1::1",
        "::ffff:127.0.0.1",
    ];

    #[test]
    fn metadata_and_embedded_addresses_are_refused_with_or_without_the_setting() {
        for text in ALWAYS_REFUSED {
            let ip: IpAddr = text.parse().expect("an address");
            assert_eq!(classify(ip), AddressClass::Reserved, "{text}");
            assert!(!allowed(ip, true), "{text} allowed with the setting");
            assert!(!allowed(ip, false), "{text} allowed");
        }
        for text in PRIVATE {
            let ip: IpAddr = text.parse().expect("an address");
            assert_eq!(classify(ip), AddressClass::Private, "{text}");
            assert!(allowed(ip, true), "{text} refused with the setting");
            assert!(!allowed(ip, false), "{text} allowed");
        }
        // Public addresses in the same forms stay public.
        for text in [
            "64:ff9b::8.8.8.8",
            "2002:808:808::1",
            "::ffff:8.8.8.8",
            "100.128.1.1",
        ] {
            let ip: IpAddr = text.parse().expect("an address");
            assert!(allowed(ip, false), "{text} refused");
        }
    }

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
