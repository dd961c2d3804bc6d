//! Consent as an attacker sees it, with real processes (the Python OAuth
//! fixtures of oauth.rs): a link finished by someone else grants nothing,
//! another tenant's link cannot be confirmed, a code works once, and a
//! malicious server's authorization server cannot relay an honest server's
//! code to its own token endpoint (the mix-up).

use tonic_types::StatusExt;
use toolgate::pb;

use crate::common::*;
use crate::oauth::{
    Scratch, as_stats, audit_events, audited, authorization_url, call, call_settled, config,
    confirm, consent, env, upstream, upstream_with,
};

/// Where globex's application confirms consents.
const GLOBEX_RETURN_URL: &str = "http://127.0.0.1:9/globex/consent";

/// [`config`] with a second tenant, globex, that has the same server.
fn two_tenants(yaml: &str, mcp_url: &str) -> String {
    format!(
        "{yaml}  - name: globex\n    tokens: [globex-token]\n    consent_return_url: {GLOBEX_RETURN_URL}\n    servers:\n      - name: docs\n        url: \"{mcp_url}\"\n        oauth: {{ grant: authorization_code }}\n"
    )
}

fn assert_reason(status: &tonic::Status, code: tonic::Code, reason: &str) {
    assert_eq!(status.code(), code, "{status:?}");
    assert_eq!(crate::common::reason(status), reason, "{status:?}");
}

#[tokio::test]
async fn a_link_finished_by_another_user_or_tenant_never_makes_their_account_usable() {
    let upstream = upstream(3600);
    let Scratch {
        dir: _dir,
        state_url,
        audit,
    } = Scratch::new();
    let consent_port = free_port();
    let yaml = audited(
        &audit,
        &two_tenants(
            &config(&upstream, &state_url, consent_port),
            &upstream.mcp_url,
        ),
    );
    let gateway = TestGateway::start(&yaml, &env()).await;
    let mut client = gateway.client().await;

    // Mallory takes the link her own call got and sends it to Alice, who is
    // logged in at the authorization server and consents.
    let status = call_settled(&mut client, Some("mallory"), "docs__whoami")
        .await
        .unwrap_err();
    let mallorys_link = authorization_url(&status);
    let (answer, code) = consent(&mallorys_link, "alice", consent_port).await;
    assert_eq!(
        answer, 303,
        "the browser goes on to the application: {code}"
    );

    // acme's application, where Alice is logged in, confirms for Alice:
    // refused, and the held grant is gone.
    let refused = confirm(&mut client, "alice", &code).await.unwrap_err();
    assert_reason(
        &refused,
        tonic::Code::PermissionDenied,
        "CONSENT_SUBJECT_MISMATCH",
    );
    assert!(refused.message().contains("another subject"), "{refused:?}");
    let info = refused.get_details_error_info().unwrap();
    assert_eq!(
        info.metadata.get("server").map(String::as_str),
        Some("docs")
    );
    let again = confirm(&mut client, "mallory", &code).await.unwrap_err();
    assert_reason(&again, tonic::Code::InvalidArgument, "CONSENT_CODE_INVALID");
    // Neither Mallory nor Alice holds a usable grant.
    for subject in ["mallory", "alice"] {
        let status = call(&mut client, Some(subject), "docs__whoami")
            .await
            .unwrap_err();
        authorization_url(&status);
    }

    // Another tenant's link: globex's Mallory sends hers to Alice. The
    // browser goes to globex's application; a code confirmed at acme (any
    // subject) is refused.
    let mut globex = authed(
        "globex-token",
        pb::InvokeToolRequest {
            name: "docs__whoami".into(),
            arguments_json: "{}".into(),
            ..Default::default()
        },
    );
    globex
        .metadata_mut()
        .insert("x-toolgate-subject", "mallory".parse().unwrap());
    let status = client.invoke_tool(globex).await.unwrap_err();
    let globex_link = authorization_url(&status);
    let location = browse_to_callback(&globex_link, "alice", consent_port).await;
    assert!(
        location.starts_with(GLOBEX_RETURN_URL),
        "globex's consent returns to globex's application: {location}"
    );
    let globex_code = url::Url::parse(&location)
        .unwrap()
        .query_pairs()
        .find(|(k, _)| k == "code")
        .map(|(_, v)| v.into_owned())
        .unwrap();
    let refused = confirm(&mut client, "mallory", &globex_code)
        .await
        .unwrap_err();
    assert_reason(
        &refused,
        tonic::Code::PermissionDenied,
        "CONSENT_SUBJECT_MISMATCH",
    );
    assert!(refused.message().contains("another tenant"), "{refused:?}");
    let again = confirm(&mut client, "mallory", &globex_code)
        .await
        .unwrap_err();
    assert_reason(&again, tonic::Code::InvalidArgument, "CONSENT_CODE_INVALID");

    // A code that was never issued.
    let forged = confirm(&mut client, "alice", "not-a-code")
        .await
        .unwrap_err();
    assert_reason(
        &forged,
        tonic::Code::InvalidArgument,
        "CONSENT_CODE_INVALID",
    );

    // Alice's own link, confirmed for Alice, works; the code only once.
    let status = call(&mut client, Some("alice"), "docs__whoami")
        .await
        .unwrap_err();
    let alices_link = authorization_url(&status);
    let (answer, code) = consent(&alices_link, "alice", consent_port).await;
    assert_eq!(answer, 303);
    assert_eq!(confirm(&mut client, "alice", &code).await.unwrap(), "docs");
    assert_eq!(
        call_settled(&mut client, Some("alice"), "docs__whoami")
            .await
            .unwrap(),
        "alice"
    );
    let reused = confirm(&mut client, "alice", &code).await.unwrap_err();
    assert_reason(
        &reused,
        tonic::Code::InvalidArgument,
        "CONSENT_CODE_INVALID",
    );
    // Mallory still has nothing.
    let status = call(&mut client, Some("mallory"), "docs__whoami")
        .await
        .unwrap_err();
    authorization_url(&status);
    gateway.shutdown().await;

    let rejected = audit_events(&audit, "consent_rejected");
    let reasons: Vec<&str> = rejected
        .iter()
        .map(|r| r["reason"].as_str().unwrap_or_default())
        .collect();
    assert!(reasons.contains(&"subject_mismatch"), "{rejected:#?}");
    assert!(reasons.contains(&"tenant_mismatch"), "{rejected:#?}");
    assert_eq!(audit_events(&audit, "consent_held").len(), 3);
    assert_eq!(audit_events(&audit, "consent_completed").len(), 1);
}

/// Opens `url` as `user` and delivers the authorization server's redirect
/// to the consent listener; returns where the listener sends the browser.
async fn browse_to_callback(url: &str, user: &str, consent_port: u16) -> String {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let authorize = http.get(format!("{url}&user={user}")).send().await.unwrap();
    assert_eq!(authorize.status().as_u16(), 302, "{authorize:?}");
    let mut callback = url::Url::parse(authorize.headers()["location"].to_str().unwrap()).unwrap();
    callback.set_port(Some(consent_port)).unwrap();
    let answer = http.get(callback.as_str()).send().await.unwrap();
    assert_eq!(answer.status().as_u16(), 303, "{answer:?}");
    answer.headers()["location"].to_str().unwrap().to_owned()
}

/// The mix-up: a malicious MCP server names an authorization server that,
/// when a user opens the link the gateway made for the malicious server,
/// relays the browser to the honest server's authorization server with the
/// gateway's own client there (its id is in any link the honest server's
/// users get) and the flow's `state` and PKCE challenge. Neither server
/// sends RFC 9207 `iss`. The honest server's code arrives at the honest
/// server's redirect URI with the malicious flow's `state`: refused, and
/// nothing is exchanged anywhere.
#[tokio::test]
async fn an_authorization_server_relaying_another_servers_code_gets_nothing() {
    let honest = upstream_with(3600, &["--no-iss"], &[]);
    let evil = upstream_with(3600, &["--no-iss"], &[]);
    let Scratch {
        dir: _dir,
        state_url,
        audit,
    } = Scratch::new();
    let consent_port = free_port();
    let yaml = audited(
        &audit,
        &format!(
            "{}      - name: evil\n        url: \"{}\"\n        oauth: {{ grant: authorization_code }}\n",
            config(&honest, &state_url, consent_port),
            evil.mcp_url
        ),
    );
    let gateway = TestGateway::start(&yaml, &env()).await;
    let mut client = gateway.client().await;

    // The gateway's client at the honest server, from any link of it.
    let status = call_settled(&mut client, Some("mallory"), "docs__whoami")
        .await
        .unwrap_err();
    let honest_link = url::Url::parse(&authorization_url(&status)).unwrap();
    let param = |url: &url::Url, name: &str| {
        url.query_pairs()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
            .unwrap()
    };
    let relay = serde_json::json!({
        "authorize": format!("{}/authorize", honest.as_url),
        "client_id": param(&honest_link, "client_id"),
        "redirect_uri": param(&honest_link, "redirect_uri"),
    });
    let armed = reqwest::Client::new()
        .post(format!("{}/admin/relay", evil.as_url))
        .json(&relay)
        .send()
        .await
        .unwrap();
    assert!(armed.status().is_success());

    // Alice opens the link the gateway made for the malicious server.
    let status = call_settled(&mut client, Some("alice"), "evil__whoami")
        .await
        .unwrap_err();
    let evil_link = authorization_url(&status);
    assert!(evil_link.starts_with(&evil.as_url), "{evil_link}");
    let honest_before = as_stats(&honest).await;
    let (answer, page) = consent(&evil_link, "alice", consent_port).await;
    assert_eq!(answer, 400, "{page}");
    assert!(page.contains("another server"), "{page}");
    assert!(
        page.contains("the server <code>evil</code> of tenant <code>acme</code>")
            && page.contains("subject <code>token:alice</code>"),
        "the page says whose authorization it was: {page}"
    );

    // No code reached the malicious token endpoint, and the honest code was
    // never exchanged.
    let evil_stats = as_stats(&evil).await;
    assert_eq!(
        evil_stats["token_requests"]["authorization_code"].as_u64(),
        None,
        "the malicious server got a code to exchange: {evil_stats}"
    );
    let honest_after = as_stats(&honest).await;
    assert_eq!(
        honest_after["token_requests"]["authorization_code"],
        honest_before["token_requests"]["authorization_code"],
        "{honest_after}"
    );
    // The flow is spent: Alice still needs to consent to each server.
    for tool in ["evil__whoami", "docs__whoami"] {
        let status = call(&mut client, Some("alice"), tool).await.unwrap_err();
        authorization_url(&status);
    }
    gateway.shutdown().await;
    let failed = audit_events(&audit, "consent_failed");
    assert!(
        failed.iter().any(|r| r["reason"] == "redirect_mismatch"),
        "{failed:#?}"
    );
}

/// Each tenant × server is its own client: its metadata document names the
/// tenant and lists only that server's redirect URI; a tenant or server
/// the gateway does not have has none.
#[tokio::test]
async fn each_tenant_and_server_has_its_own_client_metadata_document() {
    let upstream = upstream(3600);
    let Scratch {
        dir: _dir,
        state_url,
        ..
    } = Scratch::new();
    let consent_port = free_port();
    let yaml = two_tenants(
        &config(&upstream, &state_url, consent_port),
        &upstream.mcp_url,
    );
    let gateway = TestGateway::start(&yaml, &env()).await;
    wait_for_port(consent_port).await;
    let base = format!("http://127.0.0.1:{consent_port}");
    for tenant in ["acme", "globex"] {
        let url = format!("{base}/oauth/{tenant}/docs/client-metadata.json");
        let document: serde_json::Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
        assert_eq!(document["client_id"], url.as_str());
        assert!(
            document["client_name"].as_str().unwrap().contains(tenant),
            "{document}"
        );
        assert_eq!(
            document["redirect_uris"],
            serde_json::json!([format!("{base}/oauth/{tenant}/docs/callback")])
        );
    }
    for missing in ["nobody/docs", "acme/nothing", "acme/svc"] {
        let answer = reqwest::get(format!("{base}/oauth/{missing}/client-metadata.json"))
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 404, "{missing}");
    }
    gateway.shutdown().await;
}
