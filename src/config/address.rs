//! The address rule: the class of an IP address (public; private or
//! loopback; link-local, metadata or reserved), and the operator's
//! exceptions for the servers of tenants the operator did not write
//! (`upstream_allow`). One rule for what the gateway may contact on behalf
//! of others: the OAuth endpoints (`oauth.allow_private_addresses`) and
//! the `url` servers of tenants of the admin API and of `tenants_dir`,
//! both checked on the addresses a name resolves to, when connecting.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::fields::Errors;

/// Whether `ip` passes the address rule: public always, private and
/// loopback only with `allow_private`, reserved never. The one rule every
/// OAuth request's resolved addresses go through (the OAuth client's
/// checks and its HTTP client's resolver).
pub fn allowed(ip: IpAddr, allow_private: bool) -> bool {
    match classify(ip) {
        AddressClass::Public => true,
        AddressClass::Private => allow_private,
        AddressClass::Reserved => false,
    }
}

/// What an address is, for the address rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    /// Anything not below: reachable by every rule.
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
pub fn classify(ip: IpAddr) -> AddressClass {
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

impl AddressClass {
    /// What the class is, for a refusal: "a private or loopback address".
    pub fn describe(self) -> &'static str {
        match self {
            AddressClass::Public => "a public address",
            AddressClass::Private => "a private or loopback address",
            AddressClass::Reserved => "a link-local, metadata or reserved address",
        }
    }
}

/// `upstream_allow`: what the `url` servers of tenants of the admin API
/// and of `tenants_dir` may reach besides public addresses. Each entry is
/// an address or a CIDR range (`10.0.0.0/8`, `::1`), or a host name, each
/// with an optional port (`127.0.0.1:8080`, `[fd00::/8]:443`,
/// `mcp-sidecar:8080`); without a port, every port. A link-local,
/// metadata or reserved address is allowed only by an entry naming that
/// one address (or the host name the server's `url` gives), never by a
/// range.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct UpstreamAllow {
    entries: Vec<AllowEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct AllowEntry {
    target: Target,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Target {
    /// An address and its prefix length (32 or 128: that one address).
    Net { addr: IpAddr, prefix: u8 },
    /// A host name, lowercase, without a trailing dot.
    Name(String),
}

impl Target {
    fn matches(&self, host: &str, ip: IpAddr, class: AddressClass) -> bool {
        match self {
            Target::Name(name) => host.trim_end_matches('.').eq_ignore_ascii_case(name),
            Target::Net { addr, prefix } => {
                let single = *prefix == full_prefix(*addr);
                (class != AddressClass::Reserved || single) && in_net(ip, *addr, *prefix)
            }
        }
    }
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = match &self.target {
            Target::Name(name) => name.clone(),
            Target::Net { addr, prefix } if *prefix == full_prefix(*addr) => addr.to_string(),
            Target::Net { addr, prefix } => format!("{addr}/{prefix}"),
        };
        match (self.port, &self.target) {
            (None, _) => f.write_str(&target),
            (
                Some(port),
                Target::Net {
                    addr: IpAddr::V6(_),
                    ..
                },
            ) => write!(f, "[{target}]:{port}"),
            (Some(port), _) => write!(f, "{target}:{port}"),
        }
    }
}

fn full_prefix(addr: IpAddr) -> u8 {
    if addr.is_ipv4() { 32 } else { 128 }
}

/// Whether `ip` is in `addr/prefix` (an IPv4-mapped IPv6 address read as
/// IPv4).
fn in_net(ip: IpAddr, addr: IpAddr, prefix: u8) -> bool {
    match (ip.to_canonical(), addr) {
        (IpAddr::V4(ip), IpAddr::V4(net)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(net) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(net)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(net) & mask
        }
        _ => false,
    }
}

impl UpstreamAllow {
    /// Whether a server whose `url` names `host` may be reached at
    /// `ip`:`port` under the rule of tenants the operator did not write:
    /// public addresses always; others only as an entry allows them.
    ///
    /// # Errors
    /// The address's class, when it is refused.
    pub fn check(&self, host: &str, ip: IpAddr, port: u16) -> Result<(), AddressClass> {
        let class = classify(ip);
        if class == AddressClass::Public
            || self.entries.iter().any(|entry| {
                entry.port.is_none_or(|p| p == port) && entry.target.matches(host, ip, class)
            })
        {
            Ok(())
        } else {
            Err(class)
        }
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Parses one entry of `upstream_allow`.
fn parse_entry(text: &str) -> Result<AllowEntry, String> {
    let text = text.trim();
    let port = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("`{p}` is not a port (1 to 65535)"))
    };
    // `[v6 or v6/prefix]:port`, `v4 or v4/prefix or name:port`, or no port.
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("a `[` without its `]`")?;
        match after {
            "" => (host, None),
            _ => {
                let p = after
                    .strip_prefix(':')
                    .ok_or("after `]` only `:PORT` may follow")?;
                (host, Some(port(p)?))
            }
        }
    } else if text.matches(':').count() == 1 {
        let (host, p) = text.split_once(':').expect("one colon");
        (host, Some(port(p)?))
    } else {
        (text, None)
    };
    if host.is_empty() {
        return Err("needs an address, a CIDR range or a host name".into());
    }
    let target = if let Some((addr, prefix)) = host.split_once('/') {
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("`{addr}` is not an IP address (before `/` in a CIDR range)"))?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= full_prefix(addr))
            .ok_or_else(|| {
                format!(
                    "`/{prefix}` is not a prefix length of {} (0 to {})",
                    addr,
                    full_prefix(addr)
                )
            })?;
        Target::Net { addr, prefix }
    } else if let Ok(addr) = host.parse::<IpAddr>() {
        Target::Net {
            addr,
            prefix: full_prefix(addr),
        }
    } else if host.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    }) && host.len() <= 253
    {
        Target::Name(host.trim_end_matches('.').to_ascii_lowercase())
    } else {
        return Err(format!(
            "`{host}` is not an IP address, a CIDR range (`10.0.0.0/8`) or a host name"
        ));
    };
    Ok(AllowEntry { target, port })
}

/// Validates `upstream_allow`; errors name `upstream_allow[i]`.
pub(super) fn upstream_allow(errors: &mut Errors, raw: Vec<String>) -> UpstreamAllow {
    let mut entries = Vec::with_capacity(raw.len());
    for (index, text) in raw.iter().enumerate() {
        match parse_entry(text) {
            Ok(entry) => entries.push(entry),
            Err(message) => errors.push(format!("upstream_allow[{index}]"), message),
        }
    }
    UpstreamAllow { entries }
}

impl fmt::Display for UpstreamAllow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: Vec<String> = self.entries.iter().map(ToString::to_string).collect();
        write!(f, "[{}]", shown.join(", "))
    }
}

#[cfg(test)]
pub(crate) mod tests {
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
    pub(crate) const ALWAYS_REFUSED: [&str; 14] = [
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
    pub(crate) const PRIVATE: [&str; 7] = [
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

    fn allow(entries: &[&str]) -> UpstreamAllow {
        let mut errors = Errors(Vec::new());
        let allow = upstream_allow(
            &mut errors,
            entries.iter().map(|s| (*s).to_owned()).collect(),
        );
        assert!(errors.0.is_empty(), "{:?}", errors.0);
        allow
    }

    #[test]
    fn the_allow_list_excepts_what_it_names() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let none = UpstreamAllow::default();
        assert_eq!(none.check("example.com", ip("8.8.8.8"), 443), Ok(()));
        assert_eq!(
            none.check("127.0.0.1", ip("127.0.0.1"), 80),
            Err(AddressClass::Private)
        );
        let list = allow(&[
            "127.0.0.1:8080",
            "10.0.0.0/8",
            "[fd00::/8]:443",
            "Sidecar.local:9000",
            "169.254.169.254",
            "100.64.0.0/10",
        ]);
        assert_eq!(list.check("127.0.0.1", ip("127.0.0.1"), 8080), Ok(()));
        assert!(list.check("127.0.0.1", ip("127.0.0.1"), 9090).is_err());
        assert_eq!(list.check("x", ip("10.9.8.7"), 1), Ok(()));
        assert_eq!(list.check("x", ip("::ffff:10.9.8.7"), 1), Ok(()));
        assert_eq!(list.check("x", ip("fd00::1"), 443), Ok(()));
        assert!(list.check("x", ip("fd00::1"), 80).is_err());
        assert_eq!(list.check("sidecar.local.", ip("127.0.0.5"), 9000), Ok(()));
        assert!(list.check("sidecar.local", ip("127.0.0.5"), 9001).is_err());
        // A reserved address only by its own entry, never by a range.
        assert_eq!(list.check("x", ip("169.254.169.254"), 80), Ok(()));
        assert_eq!(
            list.check("x", ip("100.100.100.200"), 80),
            Err(AddressClass::Reserved)
        );
        assert_eq!(list.check("x", ip("100.64.1.1"), 80), Ok(()));
        assert_eq!(
            list.to_string(),
            "[127.0.0.1:8080, 10.0.0.0/8, [fd00::/8]:443, sidecar.local:9000, 169.254.169.254, 100.64.0.0/10]"
        );
    }

    #[test]
    fn bad_entries_are_refused_naming_their_index() {
        for bad in [
            "",
            "10.0.0.0/33",
            "127.0.0.1:0",
            "127.0.0.1:http",
            "[::1",
            "a b",
            "::1/200",
        ] {
            let mut errors = Errors(Vec::new());
            upstream_allow(&mut errors, vec!["10.0.0.0/8".into(), bad.into()]);
            assert_eq!(errors.0.len(), 1, "{bad:?}");
            assert_eq!(errors.0[0].path, "upstream_allow[1]", "{bad:?}");
        }
    }
}
