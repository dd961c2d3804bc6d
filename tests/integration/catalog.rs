//! The catalog: paging, namespacing, name validation, collisions, filters,
//! failing servers.

use crate::common::*;

const TOKEN: &str = "acme-token";

fn yaml(servers: &str) -> String {
    format!("tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n{servers}")
}

#[tokio::test]
async fn follows_every_page_and_namespaces_names() {
    let names_250: Vec<String> = (0..250).map(|i| format!("tool_{i:03}")).collect();
    let refs: Vec<&str> = names_250.iter().map(String::as_str).collect();
    let server =
        serve_mcp(TestServer::new(&refs).with_paging(Paging::Pages { page_size: 100 })).await;
    let gateway = TestGateway::start(
        &yaml(&format!(
            "      - name: big\n        url: \"{}\"\n",
            server.url
        )),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let listing = list(&mut client, TOKEN).await;
    assert_eq!(listing.tools.len(), 250, "all three pages are read");
    assert_eq!(listing.tools[0].name, "big__tool_000");
    assert_eq!(listing.tools[249].name, "big__tool_249");
    assert_eq!(listing.tools[0].upstream_name, "tool_000");
    assert_eq!(listing.tools[0].server, "big");
    assert_eq!(*server.log.list_calls.lock().unwrap(), 3);
    let status = &listing.servers[0];
    assert!(status.connected);
    assert_eq!(status.tool_count, 250);
    assert!(!listing.catalog_version.is_empty());
    gateway.shutdown().await;
}

#[tokio::test]
async fn endless_paging_and_repeated_cursors_fail_that_server_only() {
    let forever = serve_mcp(TestServer::new(&[]).with_paging(Paging::Forever)).await;
    let repeat = serve_mcp(TestServer::new(&["a"]).with_paging(Paging::RepeatCursor)).await;
    let good = serve_mcp(TestServer::new(&["echo"])).await;
    let gateway = TestGateway::start(
        &yaml(&format!(
            "      - name: forever\n        url: \"{}\"\n        max_list_pages: 20\n      - name: repeat\n        url: \"{}\"\n      - name: good\n        url: \"{}\"\n",
            forever.url, repeat.url, good.url
        )),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let listing = list(&mut client, TOKEN).await;
    assert_eq!(names(&listing), ["good__echo"]);
    let forever_status = &listing.servers[0];
    assert!(!forever_status.connected);
    assert!(
        forever_status.error.contains("more than 20 pages"),
        "{}",
        forever_status.error
    );
    assert_eq!(*forever.log.list_calls.lock().unwrap(), 20);
    let repeat_status = &listing.servers[1];
    assert!(
        repeat_status.error.contains("repeated the cursor"),
        "{}",
        repeat_status.error
    );
    // The tenant's healthy server still works.
    let answer = invoke(&mut client, TOKEN, "good__echo", r#"{"text":"hi"}"#)
        .await
        .unwrap();
    assert_eq!(answer.text, "hi");
    gateway.shutdown().await;
}

#[tokio::test]
async fn an_invalid_tool_name_refuses_the_server_naming_both() {
    let bad = serve_mcp(TestServer::new(&["fine", "not valid!"])).await;
    let long = serve_mcp(TestServer::new(&[&"x".repeat(60)])).await;
    let good = serve_mcp(TestServer::new(&["echo"])).await;
    let gateway = TestGateway::start(
        &yaml(&format!(
            "      - name: bad\n        url: \"{}\"\n      - name: long\n        url: \"{}\"\n      - name: good\n        url: \"{}\"\n",
            bad.url, long.url, good.url
        )),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let listing = list(&mut client, TOKEN).await;
    assert_eq!(names(&listing), ["good__echo"]);
    let bad_status = &listing.servers[0];
    assert_eq!(bad_status.state, toolgate::pb::ServerState::Refused as i32);
    assert!(
        bad_status.error.contains("`not valid!`") && bad_status.error.contains("`bad`"),
        "{}",
        bad_status.error
    );
    // 60 characters is fine upstream, but `long__` makes it 66.
    assert!(
        listing.servers[1].error.contains("long__xxx"),
        "{}",
        listing.servers[1].error
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_name_claimed_by_two_servers_is_refused_for_both() {
    let one = serve_mcp(TestServer::new(&["search"])).await;
    let two = serve_mcp(TestServer::new(&["search"])).await;
    let other = serve_mcp(TestServer::new(&["search"])).await;
    let gateway = TestGateway::start(
        &yaml(&format!(
            "      - name: one\n        url: \"{}\"\n        bare: true\n      - name: two\n        url: \"{}\"\n        bare: true\n      - name: other\n        url: \"{}\"\n",
            one.url, two.url, other.url
        )),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let listing = list(&mut client, TOKEN).await;
    // Neither bare server wins; the prefixed one is unaffected.
    assert_eq!(names(&listing), ["other__search"]);
    for status in &listing.servers[..2] {
        assert!(!status.connected);
        assert!(
            status.error.contains("`one`")
                && status.error.contains("`two`")
                && status.error.contains("`search`"),
            "{}",
            status.error
        );
    }
    let err = invoke(&mut client, TOKEN, "search", "{}")
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    gateway.shutdown().await;
}

#[tokio::test]
async fn allow_and_deny_filters_apply_before_exposure() {
    let server = serve_mcp(TestServer::new(&[
        "search_docs",
        "search_admin",
        "delete",
        "echo",
    ]))
    .await;
    let gateway = TestGateway::start(
        &yaml(&format!(
            "      - name: docs\n        url: \"{}\"\n        tools:\n          allow: [\"search*\", \"echo\"]\n          deny: [\"search_admin\"]\n",
            server.url
        )),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let listing = list(&mut client, TOKEN).await;
    assert_eq!(names(&listing), ["docs__echo", "docs__search_docs"]);
    for hidden in ["docs__search_admin", "docs__delete"] {
        let err = invoke(&mut client, TOKEN, hidden, "{}").await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound, "{hidden}");
        assert_eq!(reason(&err), "TOOL_NOT_FOUND");
    }
    gateway.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_server_is_reported_and_others_serve() {
    let good = serve_mcp(TestServer::new(&["echo"])).await;
    let dead_port = free_port();
    let gateway = TestGateway::start(
        &yaml(&format!(
            "      - name: dead\n        url: \"http://127.0.0.1:{dead_port}/mcp\"\n      - name: missing\n        command: [\"/nonexistent/server\"]\n      - name: good\n        url: \"{}\"\n",
            good.url
        )),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let listing = list(&mut client, TOKEN).await;
    assert_eq!(names(&listing), ["good__echo"]);
    assert_eq!(
        listing.servers[0].state,
        toolgate::pb::ServerState::Failed as i32
    );
    assert!(!listing.servers[0].error.is_empty());
    assert!(
        listing.servers[1]
            .error
            .contains("cannot start `/nonexistent/server`"),
        "{}",
        listing.servers[1].error
    );
    assert_eq!(
        invoke(&mut client, TOKEN, "good__echo", r#"{"text":"ok"}"#)
            .await
            .unwrap()
            .text,
        "ok"
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn catalog_version_is_stable_and_content_derived() {
    let a = serve_mcp(TestServer::new(&["x", "y"])).await;
    let b = serve_mcp(TestServer::new(&["x", "y"])).await;
    let c = serve_mcp(TestServer::new(&["x", "z"])).await;
    let mut versions = Vec::new();
    for url in [&a.url, &b.url, &c.url] {
        let gateway = TestGateway::start(
            &yaml(&format!("      - name: s\n        url: \"{url}\"\n")),
            &[],
        )
        .await;
        let mut client = gateway.client().await;
        let first = list(&mut client, TOKEN).await;
        let again = list(&mut client, TOKEN).await;
        assert_eq!(first.catalog_version, again.catalog_version);
        assert!(first.tools.iter().all(|t| !t.definition_hash.is_empty()));
        versions.push(first.catalog_version);
        gateway.shutdown().await;
    }
    assert_eq!(versions[0], versions[1], "same tools, same version");
    assert_ne!(
        versions[0], versions[2],
        "different tools, different version"
    );
}
