//! The address rule for the `url` servers of tenants the operator did not
//! write ([`Reach::Restricted`]: tenants of `tenants_dir` and of the admin
//! API): public addresses, and what `upstream_allow` allows
//! ([`crate::config::address`], the rule the OAuth endpoints follow). It is
//! checked before anything is sent ([`check`]: the URL's host resolved and
//! every address checked, so a refused server is never contacted), and
//! again on the addresses of every connection ([`client`]'s resolver), so a
//! name that resolves elsewhere later is refused then too. Call approval
//! webhooks go under the same rule ([`webhook_client`]).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};

use crate::config::address::{AddressClass, UpstreamAllow};
use crate::config::{Reach, TlsTrust};

use super::UpstreamError;

/// Who the rule holds, in a refusal: the servers of tenants the operator
/// did not write.
const SERVERS: &str = "servers of tenants from tenants_dir or the admin API";

/// Who the rule holds, in a refusal: call approval webhooks.
const WEBHOOKS: &str = "call approval webhooks";

/// Why a connection to `ip`:`port` (the URL's `host`) is refused to `who`:
/// the address, its class and the setting that would allow it.
fn refusal(host: &str, ip: IpAddr, port: u16, class: AddressClass, who: &str) -> String {
    let at = SocketAddr::new(ip, port);
    let address = if host.trim_matches(['[', ']']) == ip.to_string() {
        at.to_string()
    } else {
        format!("{host} (resolved to {at})")
    };
    format!(
        "{address} is {}, which {who} may not reach; nothing was sent. An operator can allow \
         it in the configuration file's `upstream_allow` (e.g. \"{at}\")",
        class.describe()
    )
}

/// Checks every address `url`'s host resolves to (or its IP literal)
/// under `reach`, before the server is contacted. A name that does not
/// resolve is left to the connection to fail.
///
/// # Errors
/// [`UpstreamError::AddressRefused`] naming `server`, the address and
/// the setting.
pub(super) async fn check(
    url: &url::Url,
    reach: &Reach,
    server: &str,
) -> Result<(), UpstreamError> {
    let Reach::Restricted(allow) = reach else {
        return Ok(());
    };
    match refused(url, allow, SERVERS).await {
        Some(reason) => Err(UpstreamError::AddressRefused {
            server: server.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// The first address of `url`'s host (or its IP literal) that `allow`
/// refuses, as a refusal to `who`. A name that does not resolve is left to
/// the connection to fail.
async fn refused(url: &url::Url, allow: &UpstreamAllow, who: &str) -> Option<String> {
    let port = url.port_or_known_default().unwrap_or(443);
    let host = url.host_str().unwrap_or_default();
    let addresses: Vec<IpAddr> = match url.host() {
        Some(url::Host::Ipv4(ip)) => vec![IpAddr::V4(ip)],
        Some(url::Host::Ipv6(ip)) => vec![IpAddr::V6(ip)],
        Some(url::Host::Domain(name)) => match tokio::net::lookup_host((name, port)).await {
            Ok(found) => found.map(|a| a.ip()).collect(),
            Err(_) => return None,
        },
        None => Vec::new(),
    };
    addresses.into_iter().find_map(|ip| {
        allow
            .check(host, ip, port)
            .err()
            .map(|class| refusal(host, ip, port, class, who))
    })
}

/// The HTTP client of a call approval webhook to `url`, once every address
/// its host resolves to passed `allow` (public addresses, and what
/// `upstream_allow` allows: the rule of the servers of tenants the operator
/// did not write); the client's resolver checks each connection's
/// addresses again. It follows no redirects and trusts the system's roots.
///
/// # Errors
/// Why an address is refused (nothing was sent), or why the client cannot
/// be built. Neither names the URL's path or query.
pub(crate) async fn webhook_client(
    url: &url::Url,
    allow: &Arc<UpstreamAllow>,
) -> Result<Arc<reqwest::Client>, String> {
    if let Some(reason) = refused(url, allow, WEBHOOKS).await {
        return Err(reason);
    }
    super::http::client::ensure_crypto_provider();
    let port = url.port_or_known_default().unwrap_or(443);
    restricted_client(None, port, allow, WEBHOOKS).map_err(|e| e.to_string())
}

/// The HTTP client of every restricted session to `port` with `tls`'s
/// roots (the system's without): its resolver refuses a name with an
/// address `allow` refuses. One per (roots, port, allow-list), shared with
/// its connection pool and dropped with the last session using it; the
/// port is part of the key because the resolver is not told it, and
/// `upstream_allow` entries may name one.
///
/// # Errors
/// The HTTP client cannot be built.
pub(super) fn client(
    tls: Option<&TlsTrust>,
    port: u16,
    allow: &Arc<UpstreamAllow>,
) -> Result<Arc<reqwest::Client>, UpstreamError> {
    restricted_client(tls, port, allow, SERVERS)
}

/// [`client`] for `who` (named in the resolver's refusals, and part of
/// the key: webhooks and sessions share no client).
fn restricted_client(
    tls: Option<&TlsTrust>,
    port: u16,
    allow: &Arc<UpstreamAllow>,
    who: &'static str,
) -> Result<Arc<reqwest::Client>, UpstreamError> {
    type Key = (Option<[u8; 32]>, u16, UpstreamAllow, &'static str);
    type Clients = std::sync::Mutex<HashMap<Key, Weak<reqwest::Client>>>;
    static CLIENTS: std::sync::OnceLock<Clients> = std::sync::OnceLock::new();
    let clients = CLIENTS.get_or_init(Default::default);
    let key: Key = (
        tls.map(TlsTrust::digest),
        port,
        UpstreamAllow::clone(allow),
        who,
    );
    // Poisoning cannot leave the map inconsistent (single inserts).
    let mut clients = clients.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(client) = clients.get(&key).and_then(Weak::upgrade) {
        return Ok(client);
    }
    let resolver = Resolver {
        port,
        allow: allow.clone(),
        who,
    };
    let builder = super::http::client::client_builder().dns_resolver(Arc::new(resolver));
    let client = Arc::new(super::http::client::build_client(builder, tls)?);
    clients.retain(|_, client| client.strong_count() > 0);
    clients.insert(key, Arc::downgrade(&client));
    Ok(client)
}

/// A resolver that refuses a name with an address the rule refuses.
struct Resolver {
    port: u16,
    allow: Arc<UpstreamAllow>,
    who: &'static str,
}

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let (port, allow, who) = (self.port, self.allow.clone(), self.who);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
                .await?
                .collect();
            for address in &found {
                if let Err(class) = allow.check(&host, address.ip(), port) {
                    return Err(refusal(&host, address.ip(), port, class, who).into());
                }
            }
            Ok(Box::new(found.into_iter()) as reqwest::dns::Addrs)
        })
    }
}
