//! Live OAuth tokens never travel back: an upstream that echoes the bearer
//! token it received (tests/fixtures/python/oauth_mcp_server.py
//! `--leak-token`: in a failed `tools/list` for an end user's token, in a
//! tool result, in a JSON-RPC error of a call) reaches no other subject's
//! `ServerStatus.error` (`ListTools`, `WatchTools`), no caller, no line of
//! the gateway's log and no audit record. What the upstream said is still
//! shown, with `[redacted]` where the token was.

use std::time::Duration;

use toolgate::pb;

use crate::common::*;
use crate::oauth::{
    Upstream, as_stats, authorization_url, call, call_settled, config, consent_confirmed, env,
    listing, server, upstream_with,
};

/// Every token the authorization server issued (access and refresh).
async fn issued_tokens(upstream: &Upstream) -> Vec<String> {
    let stats = as_stats(upstream).await;
    stats["issued_token_values"]
        .as_array()
        .expect("the server lists what it issued")
        .iter()
        .map(|t| t.as_str().unwrap().to_owned())
        .filter(|t| !t.is_empty())
        .collect()
}

/// `text` carries none of `tokens`, and shows that something was redacted.
fn assert_redacted(what: &str, text: &str, tokens: &[String]) {
    for token in tokens {
        assert!(
            !text.contains(token.as_str()),
            "{what} carries a live token: {text}"
        );
    }
    assert!(
        text.contains("[redacted]"),
        "{what} shows no redaction: {text}"
    );
}

#[tokio::test]
async fn an_echoed_live_token_reaches_no_caller_status_or_log() {
    // The gateway runs as its own process: this one's HTTP client needs
    // the TLS provider the in-process gateway would install.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let upstream = upstream_with(3600, &[], &["--leak-token"]);
    let dir = tempfile::tempdir().unwrap();
    let state_url = format!("sqlite://{}/state.db", dir.path().display());
    let consent_port = free_port();
    let port = free_port();
    let audit = dir.path().join("audit.jsonl");
    let yaml = format!(
        "listen: \"127.0.0.1:{port}\"\naudit:\n  path: \"{}\"\n{}",
        audit.display(),
        config(&upstream, &state_url, consent_port)
    );
    let config_path = dir.path().join("toolgate.yaml");
    std::fs::write(&config_path, yaml).unwrap();
    let log = dir.path().join("gateway.log");
    let mut environment = env().to_vec();
    // The default filter (rmcp's own INFO lines, which print what a server
    // sent as it sent it, are off), and toolgate's DEBUG lines.
    environment.push(("RUST_LOG", "info,rmcp=warn,toolgate=debug"));
    let _gateway = serve_binary(&config_path, &log, &environment);
    wait_for_port(port).await;
    let mut client = client_at(port).await;

    // The tenant's own (client credentials) token, echoed in a tool result
    // and in a JSON-RPC error of a call.
    let text = call_settled(&mut client, None, "svc__leak").await.unwrap();
    let tokens = issued_tokens(&upstream).await;
    assert!(!tokens.is_empty(), "the tenant's token");
    assert_redacted("a tool result", &text, &tokens);
    // An internal error's text goes to the log only (checked below).
    let status = call(&mut client, None, "svc__leak_error")
        .await
        .unwrap_err();
    for token in &tokens {
        assert!(!status.message().contains(token.as_str()), "{status:?}");
    }

    // And in a progress message relayed to the caller.
    let mut request = authed(
        "acme-token",
        pb::InvokeToolRequest {
            name: "svc__leak_progress".to_owned(),
            arguments_json: "{}".to_owned(),
            ..Default::default()
        },
    );
    request.set_timeout(Duration::from_secs(20));
    let mut stream = client
        .invoke_tool_stream(request)
        .await
        .unwrap()
        .into_inner();
    let mut messages = Vec::new();
    while let Some(event) = stream.message().await.unwrap() {
        if let Some(pb::invoke_tool_event::Event::Progress(progress)) = event.event {
            messages.push(progress.message);
        }
    }
    // (A notification that lost the race with the result is not relayed;
    // the handler's own test covers the redaction deterministically.)
    assert!(messages.len() <= 1, "{messages:?}");
    for message in &messages {
        assert_redacted("a progress message", message, &tokens);
    }

    // Alice and Bob consent; the server's tools are then listed with
    // Alice's token (the oldest consent), and the listing fails quoting it.
    for user in ["alice", "bob"] {
        let status = call_settled(&mut client, Some(user), "docs__whoami")
            .await
            .unwrap_err();
        let url = authorization_url(&status);
        consent_confirmed(&mut client, &url, user, consent_port).await;
    }

    // Carol, who never consented, watches the tenant's tools: she sees why
    // the server failed, without Alice's token.
    let mut request = authed("acme-token", pb::WatchToolsRequest::default());
    request
        .metadata_mut()
        .insert("x-toolgate-subject", "carol".parse().unwrap());
    let mut watch = client.watch_tools(request).await.unwrap().into_inner();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let watched = loop {
        let next = tokio::time::timeout_at(deadline, watch.message())
            .await
            .expect("the listing fails within 20 s")
            .unwrap()
            .unwrap();
        if server(&next, "docs").state == pb::ServerState::Failed as i32 {
            break next;
        }
    };
    let tokens = issued_tokens(&upstream).await;
    assert!(
        tokens.len() >= 5,
        "alice's and bob's tokens too: {tokens:?}"
    );
    let error = &server(&watched, "docs").error;
    assert_redacted("carol's WatchTools ServerStatus.error", error, &tokens);
    assert!(error.contains("cannot list tools"), "{error}");

    // Bob, who consented, lists the tools: the same, without Alice's token.
    let bob = listing(&mut client, "bob").await;
    let docs = server(&bob, "docs");
    assert_eq!(docs.state, pb::ServerState::Failed as i32, "{docs:?}");
    assert_redacted("bob's ServerStatus.error", &docs.error, &tokens);

    // Alice's own call fails the same way (her session lists first): no
    // token in her error either.
    let status = call(&mut client, Some("alice"), "docs__whoami")
        .await
        .unwrap_err();
    assert_redacted("alice's call error", status.message(), &tokens);

    // The gateway logged the failures, and no token.
    let text = std::fs::read_to_string(&log).unwrap();
    assert_redacted("the gateway log", &text, &tokens);
    let records = std::fs::read_to_string(&audit).unwrap_or_default();
    for token in &tokens {
        assert!(
            !records.contains(token.as_str()),
            "an audit record carries a live token"
        );
    }
}
