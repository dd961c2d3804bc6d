//! ListResources and ReadResource against real servers: server-everything
//! (npm) over stdio and Streamable HTTP, including following the
//! `resource_link` a tool returns; and `resources_server.py` on the Python
//! `mcp` SDK on both revisions (`lifecycle: initialize` = 2025-11-25,
//! `lifecycle: discover` = 2026-07-28): contents of 1 MiB as text and as a
//! blob, templates, freshness (list_changed on both revisions, `ttlMs`),
//! paging across 2,500 resources with a change mid-way, two servers with one
//! URI, `max_result_bytes` (listed size and transport cap), redaction, not
//! found, and a 2026-07-28 read that asks a question.

use std::time::Duration;

use serde_json::Value;
use tonic::Code;
use tonic::transport::Channel;
use toolgate::pb;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;

use crate::common::*;

pub(crate) const TOKEN: &str = "acme-token";
const MIB: usize = 1 << 20;

/// A `servers[]` entry running `resources_server.py` over stdio.
pub(crate) fn py_server(name: &str, lifecycle: &str, env: &[(&str, &str)], extra: &str) -> String {
    let mut entry = format!(
        "      - name: {name}\n        command: [\"{}\", \"{}\"]\n        lifecycle: {lifecycle}\n",
        python().display(),
        fixture("python/resources_server.py").display(),
    );
    if !env.is_empty() {
        entry.push_str("        env:\n");
        for (k, v) in env {
            entry.push_str(&format!("          {k}: {v}\n"));
        }
    }
    entry.push_str(extra);
    entry
}

pub(crate) fn tenant(servers: &str, top: &str) -> String {
    format!("{top}tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n{servers}")
}

pub(crate) async fn list_resources(
    client: &mut ToolGatewayClient<Channel>,
    request: pb::ListResourcesRequest,
) -> Result<pb::ListResourcesResponse, tonic::Status> {
    client
        .list_resources(authed(TOKEN, request))
        .await
        .map(tonic::Response::into_inner)
}

pub(crate) async fn read(
    client: &mut ToolGatewayClient<Channel>,
    server: &str,
    uri: &str,
) -> Result<pb::ReadResourceResponse, tonic::Status> {
    client
        .read_resource(authed(
            TOKEN,
            pb::ReadResourceRequest {
                server: server.to_owned(),
                uri: uri.to_owned(),
                ..Default::default()
            },
        ))
        .await
        .map(tonic::Response::into_inner)
}

pub(crate) fn text(response: &pb::ReadResourceResponse) -> &str {
    match &response.contents[0].data {
        Some(pb::resource_contents::Data::Text(text)) => text,
        other => panic!("not text: {other:?}"),
    }
}

fn blob(response: &pb::ReadResourceResponse) -> &[u8] {
    match &response.contents[0].data {
        Some(pb::resource_contents::Data::Blob(bytes)) => bytes,
        other => panic!("not a blob: {other:?}"),
    }
}

/// Lists until server `server` is connected and lists resources (its
/// session connects in the background), at most 30 s.
pub(crate) async fn wait_resources(
    client: &mut ToolGatewayClient<Channel>,
    server: &str,
) -> pb::ListResourcesResponse {
    let started = std::time::Instant::now();
    loop {
        let listing = list_resources(client, pb::ListResourcesRequest::default())
            .await
            .expect("ListResources");
        if listing.servers.iter().any(|s| {
            s.name == server
                && s.state == i32::from(pb::ServerState::Connected)
                && s.error.is_empty()
        }) {
            return listing;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{server} never listed resources: {listing:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The server's request counts (`count` tool): list, templates, read.
pub(crate) async fn counts(client: &mut ToolGatewayClient<Channel>, server: &str) -> Value {
    let answer = invoke(client, TOKEN, &format!("{server}__count"), "{}")
        .await
        .expect("count");
    serde_json::from_str(&answer.text).unwrap()
}

pub(crate) fn uris(listing: &pb::ListResourcesResponse) -> Vec<&str> {
    listing.resources.iter().map(|r| r.uri.as_str()).collect()
}

/// server-everything: static documents and templates listed, text and
/// blob reads, and a `resource_link` from a tool followed with the
/// `server` it carries.
async fn everything(yaml: &str) {
    let gateway = TestGateway::start(yaml, &[]).await;
    let mut client = gateway.client().await;
    let listing = wait_resources(&mut client, "everything").await;
    let docs: Vec<_> = uris(&listing)
        .into_iter()
        .filter(|u| u.starts_with("demo://resource/static/document/"))
        .collect();
    assert!(!docs.is_empty(), "{listing:?}");
    let templates: Vec<_> = listing
        .resource_templates
        .iter()
        .map(|t| t.uri_template.as_str())
        .collect();
    assert!(
        templates.contains(&"demo://resource/dynamic/text/{resourceId}")
            && templates.contains(&"demo://resource/dynamic/blob/{resourceId}"),
        "{templates:?}"
    );
    assert!(listing.resources.iter().all(|r| r.server == "everything"));

    let doc = read(&mut client, "everything", docs[0]).await.unwrap();
    assert!(!text(&doc).is_empty());
    assert_eq!(doc.contents[0].uri, docs[0]);

    let dynamic = read(&mut client, "everything", "demo://resource/dynamic/text/7")
        .await
        .unwrap();
    assert!(text(&dynamic).contains('7'), "{dynamic:?}");
    let bytes = read(&mut client, "everything", "demo://resource/dynamic/blob/3")
        .await
        .unwrap();
    assert!(!blob(&bytes).is_empty());

    // The Done criterion: a worker follows a resource_link.
    let answer = invoke(
        &mut client,
        TOKEN,
        "everything__get-resource-links",
        r#"{"count": 2}"#,
    )
    .await
    .unwrap();
    let links: Vec<_> = answer
        .content
        .iter()
        .filter_map(|c| match &c.kind {
            Some(pb::content::Kind::ResourceLink(link)) => Some(link.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(links.len(), 2, "{answer:?}");
    for link in links {
        assert_eq!(link.server, "everything");
        let followed = read(&mut client, &link.server, &link.uri).await.unwrap();
        assert_eq!(followed.contents[0].uri, link.uri);
        assert!(followed.contents[0].data.is_some());
    }

    // A resource the server adds (a session resource): its
    // notifications/resources/list_changed makes the next listing show it.
    let gzipped = invoke(
        &mut client,
        TOKEN,
        "everything__gzip-file-as-resource",
        r#"{"name": "hello.gz", "data": "data:text/plain;base64,aGVsbG8gcmVzb3VyY2Vz"}"#,
    )
    .await
    .unwrap();
    let link = gzipped
        .content
        .iter()
        .find_map(|c| match &c.kind {
            Some(pb::content::Kind::ResourceLink(link)) => Some(link.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{gzipped:?}"));
    wait_for_uri(&mut client, &link.uri).await;
    let gz = read(&mut client, "everything", &link.uri).await.unwrap();
    assert_eq!(&blob(&gz)[..2], b"\x1f\x8b", "{gz:?}");

    let unknown = read(&mut client, "nope", "demo://x").await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    assert_eq!(reason(&unknown), "SERVER_NOT_FOUND");
    gateway.shutdown().await;
}

#[tokio::test]
async fn server_everything_over_stdio() {
    let yaml = tenant(
        &format!(
            "      - name: everything\n        command: [\"{}\", \"{}\", \"stdio\"]\n",
            node().display(),
            everything_js().display()
        ),
        "",
    );
    everything(&yaml).await;
}

#[tokio::test]
async fn server_everything_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, port) = start_everything_http(&dir.path().join("headers.log")).await;
    let yaml = tenant(
        &format!("      - name: everything\n        url: \"http://127.0.0.1:{port}/mcp\"\n"),
        "",
    );
    everything(&yaml).await;
}

/// `resources_server.py` over Streamable HTTP on a free port, and its
/// `servers[]` entry.
async fn py_http(name: &str, lifecycle: &str) -> (ChildGuard, String) {
    let port = free_port();
    let child = std::process::Command::new(python())
        .arg(fixture("python/resources_server.py"))
        .args(["http", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let child = ChildGuard(child);
    wait_for_port(port).await;
    let entry = format!(
        "      - name: {name}\n        url: \"http://127.0.0.1:{port}/mcp\"\n        lifecycle: {lifecycle}\n"
    );
    (child, entry)
}

/// Text, 1 MiB text, 1 MiB blob, templates, not found, and
/// `max_result_bytes` both ways, on one revision, over stdio or (`http`)
/// Streamable HTTP.
async fn contents(lifecycle: &str, http: bool) {
    let (_child, servers) = if http {
        let (child, entry) = py_http("py", lifecycle).await;
        (Some(child), entry)
    } else {
        (None, py_server("py", lifecycle, &[], ""))
    };
    let yaml = tenant(&servers, "limits:\n  max_result_bytes: 1600000\n");
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    let listing = wait_resources(&mut client, "py").await;
    let listed = uris(&listing);
    for uri in ["fixture://text", "fixture://big-blob", "num://item/2"] {
        assert!(listed.contains(&uri), "{uri} in {listed:?}");
    }
    assert_eq!(listing.servers[0].resource_count as usize, listed.len());
    let templates: Vec<_> = listing
        .resource_templates
        .iter()
        .map(|t| t.uri_template.as_str())
        .collect();
    assert_eq!(templates, ["fixture://greet/{name}", "num://item/{i}"]);
    let big = listing
        .resources
        .iter()
        .find(|r| r.uri == "fixture://big-text")
        .unwrap();
    assert_eq!(big.size, Some(MIB as u64));
    assert_eq!(big.mime_type, "text/plain");

    let hello = read(&mut client, "py", "fixture://text").await.unwrap();
    assert_eq!(text(&hello), "hello from resources");
    assert_eq!(hello.contents[0].mime_type, "text/plain");
    let big_text = read(&mut client, "py", "fixture://big-text").await.unwrap();
    assert_eq!(text(&big_text).len(), MIB);
    let big_blob = read(&mut client, "py", "fixture://big-blob").await.unwrap();
    let expected: Vec<u8> = (0..MIB).map(|i| (i % 256) as u8).collect();
    assert_eq!(blob(&big_blob), expected.as_slice());
    assert_eq!(big_blob.contents[0].mime_type, "application/octet-stream");
    let greeting = read(&mut client, "py", "fixture://greet/ada")
        .await
        .unwrap();
    assert_eq!(text(&greeting), "hello ada");

    let missing = read(&mut client, "py", "fixture://missing")
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing:?}");
    assert_eq!(reason(&missing), "RESOURCE_NOT_FOUND");

    // Listed over max_result_bytes: refused at once, nothing sent.
    let before = counts(&mut client, "py").await["read"].as_u64().unwrap();
    let huge = read(&mut client, "py", "fixture://huge").await.unwrap_err();
    assert_eq!(huge.code(), Code::ResourceExhausted, "{huge:?}");
    assert_eq!(reason(&huge), "RESULT_TOO_LARGE");
    let after = counts(&mut client, "py").await["read"].as_u64().unwrap();
    assert_eq!(
        before, after,
        "a read listed over the bound reached the server"
    );
    // Not listed: the transport's cap stops it. (An SSE event over the cap,
    // as 2025-11-25 Streamable HTTP answers, costs the session, as it does
    // for a tool's result: docs/configuration.md, `max_result_bytes`.)
    let unlisted = read(&mut client, "py", "fixture://unlisted-huge")
        .await
        .unwrap_err();
    if http && lifecycle == "initialize" {
        assert_eq!(
            reason(&unlisted),
            "UPSTREAM_CONNECTION_LOST",
            "{unlisted:?}"
        );
    } else {
        assert_eq!(unlisted.code(), Code::ResourceExhausted, "{unlisted:?}");
        assert_eq!(reason(&unlisted), "RESULT_TOO_LARGE");
    }
    gateway.shutdown().await;
}

#[tokio::test]
async fn python_contents_2025_11_25() {
    contents("initialize", false).await;
}

#[tokio::test]
async fn python_contents_2025_11_25_over_http() {
    contents("initialize", true).await;
}

#[tokio::test]
async fn python_contents_2026_07_28_over_http() {
    contents("discover", true).await;
}

#[tokio::test]
async fn python_contents_2026_07_28() {
    contents("discover", false).await;
}

/// Waits (at most 30 s) until a listing holds `uri`.
async fn wait_for_uri(client: &mut ToolGatewayClient<Channel>, uri: &str) {
    let started = std::time::Instant::now();
    loop {
        let listing = list_resources(client, pb::ListResourcesRequest::default())
            .await
            .unwrap();
        if uris(&listing).contains(&uri) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{uri} never listed: {listing:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A server that declared listChanged: its listing is reused (one
/// resources/list for many ListResources) until it says the list changed,
/// then read again. 2025-11-25 gives no ttlMs; the 2026-07-28 server a
/// long one (the SDK's default is 0: no reuse), which a notice cuts short.
async fn list_changed(lifecycle: &str) {
    let env: &[(&str, &str)] = if lifecycle == "discover" {
        &[("RESOURCES_TTL_MS", "\"600000\"")]
    } else {
        &[]
    };
    let yaml = tenant(&py_server("py", lifecycle, env, ""), "");
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    wait_resources(&mut client, "py").await;
    // A 2026-07-28 listing made before the listen stream was acknowledged
    // is read once more (a change in between would not have been heard).
    let mut first = counts(&mut client, "py").await["list"].as_u64().unwrap();
    for _ in 0..50 {
        list_resources(&mut client, pb::ListResourcesRequest::default())
            .await
            .unwrap();
        let now = counts(&mut client, "py").await["list"].as_u64().unwrap();
        if now == first {
            break;
        }
        first = now;
    }
    for _ in 0..3 {
        list_resources(&mut client, pb::ListResourcesRequest::default())
            .await
            .unwrap();
    }
    let reused = counts(&mut client, "py").await["list"].as_u64().unwrap();
    assert_eq!(first, reused, "a fresh listing was fetched again");
    invoke(&mut client, TOKEN, "py__change_list", "{}")
        .await
        .unwrap();
    wait_for_uri(&mut client, "fixture://added/0").await;
    let relisted = counts(&mut client, "py").await["list"].as_u64().unwrap();
    assert!(relisted > reused);
    gateway.shutdown().await;
}

#[tokio::test]
async fn list_changed_2025_11_25() {
    list_changed("initialize").await;
}

#[tokio::test]
async fn list_changed_2026_07_28_on_a_listen_stream() {
    list_changed("discover").await;
}

/// `ttlMs: 0` (2026-07-28): never reused, so each ListResources reaches
/// the server (rmcp's own cache is off), and so does each read.
#[tokio::test]
async fn ttl_zero_lists_every_time_and_reads_are_never_cached() {
    let yaml = tenant(
        &py_server("py", "discover", &[("RESOURCES_TTL_MS", "\"0\"")], ""),
        "",
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    wait_resources(&mut client, "py").await;
    let before = counts(&mut client, "py").await;
    list_resources(&mut client, pb::ListResourcesRequest::default())
        .await
        .unwrap();
    list_resources(&mut client, pb::ListResourcesRequest::default())
        .await
        .unwrap();
    read(&mut client, "py", "fixture://text").await.unwrap();
    read(&mut client, "py", "fixture://text").await.unwrap();
    let after = counts(&mut client, "py").await;
    assert_eq!(
        after["list"].as_u64().unwrap(),
        before["list"].as_u64().unwrap() + 2,
        "{before} {after}"
    );
    assert_eq!(
        after["templates"].as_u64().unwrap(),
        before["templates"].as_u64().unwrap() + 2
    );
    assert_eq!(
        after["read"].as_u64().unwrap(),
        before["read"].as_u64().unwrap() + 2
    );
    gateway.shutdown().await;
}

/// Two servers offering one URI: each read reaches the server it names.
#[tokio::test]
async fn two_servers_one_uri() {
    let servers = format!(
        "{}{}",
        py_server("a", "initialize", &[("RESOURCES_TAG", "alpha")], ""),
        py_server("b", "discover", &[("RESOURCES_TAG", "beta")], "")
    );
    let gateway = TestGateway::start(&tenant(&servers, ""), &[]).await;
    let mut client = gateway.client().await;
    wait_resources(&mut client, "a").await;
    wait_resources(&mut client, "b").await;
    assert_eq!(
        text(&read(&mut client, "a", "fixture://same").await.unwrap()),
        "alpha"
    );
    assert_eq!(
        text(&read(&mut client, "b", "fixture://same").await.unwrap()),
        "beta"
    );
    // Filters: by server, by URI glob (over URIs and templates).
    let only_b = list_resources(
        &mut client,
        pb::ListResourcesRequest {
            servers: vec!["b".to_owned()],
            uri_globs: vec!["fixture://greet/*".to_owned(), "fixture://s*".to_owned()],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let listed: Vec<_> = only_b
        .resources
        .iter()
        .map(|r| (r.server.as_str(), r.uri.as_str()))
        .collect();
    assert_eq!(listed, [("b", "fixture://same"), ("b", "fixture://secret")]);
    let templates: Vec<_> = only_b
        .resource_templates
        .iter()
        .map(|t| t.uri_template.as_str())
        .collect();
    assert_eq!(templates, ["fixture://greet/{name}"]);
    assert_eq!(only_b.servers.len(), 1);
    gateway.shutdown().await;
}

/// 2,500 resources (and the fixture's 7), listed upstream in pages of 500,
/// handed out in pages of 1,000 with stateless tokens; a change of the
/// list mid-way makes the next token PAGE_TOKEN_EXPIRED; a token for other
/// filters, or a malformed one, is INVALID_PAGE_TOKEN.
#[tokio::test]
async fn paging_across_2500_resources() {
    let env = [
        ("RESOURCES_COUNT", "\"2500\""),
        ("RESOURCES_PAGE", "\"500\""),
        ("RESOURCES_TTL_MS", "\"0\""),
    ];
    let yaml = tenant(&py_server("py", "discover", &env, ""), "");
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    wait_resources(&mut client, "py").await;
    let page = |token: &str| pb::ListResourcesRequest {
        page_size: 1000,
        page_token: token.to_owned(),
        ..Default::default()
    };
    let mut seen = Vec::new();
    let mut token = String::new();
    for number in 0..3 {
        let listing = list_resources(&mut client, page(&token)).await.unwrap();
        // Templates and statuses come with the first page only.
        assert_eq!(listing.resource_templates.is_empty(), number > 0);
        assert_eq!(listing.servers.is_empty(), number > 0);
        if number == 0 {
            assert_eq!(listing.servers[0].resource_count, 2507);
        }
        seen.extend(listing.resources.iter().map(|r| r.uri.clone()));
        token = listing.next_page_token;
        if number < 2 {
            assert!(!token.is_empty());
        }
    }
    assert!(token.is_empty(), "a fourth page");
    assert_eq!(seen.len(), 2507);
    let distinct: std::collections::HashSet<_> = seen.iter().collect();
    assert_eq!(distinct.len(), 2507);

    let first = list_resources(&mut client, page("")).await.unwrap();
    let second = list_resources(&mut client, page(&first.next_page_token))
        .await
        .unwrap();
    invoke(&mut client, TOKEN, "py__change_list", "{}")
        .await
        .unwrap();
    let expired = list_resources(&mut client, page(&second.next_page_token))
        .await
        .unwrap_err();
    assert_eq!(expired.code(), Code::FailedPrecondition, "{expired:?}");
    assert_eq!(reason(&expired), "PAGE_TOKEN_EXPIRED");

    let mut other = page(&first.next_page_token);
    other.uri_globs = vec!["num://*".to_owned()];
    let invalid = list_resources(&mut client, other).await.unwrap_err();
    assert_eq!(invalid.code(), Code::InvalidArgument);
    assert_eq!(reason(&invalid), "INVALID_PAGE_TOKEN");
    let garbage = list_resources(&mut client, page("garbage!"))
        .await
        .unwrap_err();
    assert_eq!(reason(&garbage), "INVALID_PAGE_TOKEN");
    gateway.shutdown().await;
}

/// A configured credential the server echoes is redacted from text
/// contents; blob bytes are handed out as they came. Each read is an
/// audit record (`rpc: ReadResource`, server, redacted URI, outcome,
/// bytes), written before the response leaves.
#[tokio::test]
async fn credentials_are_redacted_from_text_not_blobs_and_reads_are_audited() {
    const SECRET: &str = "s3cr3t-resource-credential";
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let yaml = tenant(
        &py_server(
            "py",
            "initialize",
            &[("RESOURCES_SECRET", "{ env: RESOURCE_SECRET }")],
            "",
        ),
        &format!("audit:\n  path: \"{}\"\n", audit.display()),
    );
    let gateway = TestGateway::start(&yaml, &[("RESOURCE_SECRET", SECRET)]).await;
    let mut client = gateway.client().await;
    wait_resources(&mut client, "py").await;
    let secret = read(&mut client, "py", "fixture://secret").await.unwrap();
    let answered = text(&secret);
    assert!(!answered.contains(SECRET), "{answered}");
    assert!(answered.starts_with("token="), "{answered}");
    match &secret.contents[1].data {
        Some(pb::resource_contents::Data::Blob(bytes)) => assert_eq!(bytes, SECRET.as_bytes()),
        other => panic!("{other:?}"),
    }
    // A URI with the credential in it: redacted in the answer and in the
    // audit record.
    let greeting = read(&mut client, "py", &format!("fixture://greet/{SECRET}"))
        .await
        .unwrap();
    assert!(!text(&greeting).contains(SECRET), "{greeting:?}");
    assert!(!greeting.contents[0].uri.contains(SECRET), "{greeting:?}");
    read(&mut client, "py", "fixture://missing")
        .await
        .unwrap_err();

    let records: Vec<Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .filter(|r: &Value| r["rpc"] == "ReadResource")
        .collect();
    assert_eq!(records.len(), 3, "{records:#?}");
    let secret = &records[0];
    assert_eq!(secret["kind"], "call");
    assert_eq!(secret["tenant"], "acme");
    assert_eq!(secret["server"], "py");
    assert_eq!(secret["uri"], "fixture://secret");
    assert_eq!(secret["outcome"], "ok");
    assert_eq!(secret["sent"], true);
    assert!(secret["bytes"].as_u64().unwrap() > 0, "{secret}");
    assert!(secret.get("tool").is_none(), "{secret}");
    let greeting = &records[1];
    let uri = greeting["uri"].as_str().unwrap();
    assert!(
        uri.starts_with("fixture://greet/") && !uri.contains(SECRET),
        "{uri}"
    );
    let missing = &records[2];
    assert_eq!(missing["reason"], "RESOURCE_NOT_FOUND");
    assert_eq!(missing["code"], "NOT_FOUND");
    assert_eq!(missing["sent"], true);
    assert!(!std::fs::read_to_string(&audit).unwrap().contains(SECRET));
    gateway.shutdown().await;
}

/// A 2026-07-28 read that asks a question: refused unless the worker
/// accepts forms; else handed out with a sealed state, and the retry with
/// the answer completes. A state sealed for the read never opens for a
/// call (nor for another URI).
#[tokio::test]
async fn a_read_that_asks() {
    let yaml = tenant(&py_server("py", "discover", &[], ""), "");
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    wait_resources(&mut client, "py").await;
    let refused = read(&mut client, "py", "fixture://ask").await.unwrap_err();
    assert_eq!(reason(&refused), "INPUT_NOT_ACCEPTED", "{refused:?}");

    let form = Some(pb::InputCapabilities {
        form: true,
        ..Default::default()
    });
    let ask = |uri: &str, state: &str, responses: Vec<pb::InputResponse>| {
        authed(
            TOKEN,
            pb::ReadResourceRequest {
                server: "py".to_owned(),
                uri: uri.to_owned(),
                accepts_input: form,
                input_responses: responses,
                request_state: state.to_owned(),
            },
        )
    };
    let asked = client
        .read_resource(ask("fixture://ask", "", Vec::new()))
        .await
        .unwrap()
        .into_inner();
    assert!(asked.contents.is_empty());
    let required = asked.input_required.expect("input_required");
    assert_eq!(required.requests.len(), 1, "{required:?}");
    let question = &required.requests[0];
    let answer = vec![pb::InputResponse {
        id: question.id.clone(),
        action: pb::InputAction::Accept.into(),
        content_json: r#"{"answer":"42"}"#.to_owned(),
    }];
    // The state is this read's only.
    let other = client
        .read_resource(ask(
            "fixture://text",
            &required.request_state,
            answer.clone(),
        ))
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::InvalidArgument, "{other:?}");
    assert_eq!(reason(&other), "REQUEST_STATE_OTHER_CALL");
    let done = client
        .read_resource(ask("fixture://ask", &required.request_state, answer))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(text(&done), "answer=42");
    gateway.shutdown().await;
}

/// PyPI's `mcp-server-sqlite` (a reference server nobody here wrote;
/// installed by tests/setup.sh into its own venv): its `memo://insights`
/// listed and read, and read again after its `append_insight` tool
/// changed it (reads are never cached).
#[tokio::test]
async fn reference_sqlite_server() {
    let binary = repo_root().join(".venv-sqlite/bin/mcp-server-sqlite");
    assert!(
        binary.exists(),
        "{} is missing: run tests/setup.sh first",
        binary.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let yaml = tenant(
        &format!(
            "      - name: sqlite\n        command: [\"{}\", \"--db-path\", \"{}\"]\n",
            binary.display(),
            dir.path().join("test.db").display()
        ),
        "",
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    let listing = wait_resources(&mut client, "sqlite").await;
    assert_eq!(uris(&listing), ["memo://insights"]);
    let memo = read(&mut client, "sqlite", "memo://insights")
        .await
        .unwrap();
    assert!(text(&memo).contains("No business insights"), "{memo:?}");
    assert_eq!(memo.contents[0].mime_type, "text/plain");
    invoke(
        &mut client,
        TOKEN,
        "sqlite__append_insight",
        r#"{"insight": "resources reach workers"}"#,
    )
    .await
    .unwrap();
    let memo = read(&mut client, "sqlite", "memo://insights")
        .await
        .unwrap();
    assert!(text(&memo).contains("resources reach workers"), "{memo:?}");
    gateway.shutdown().await;
}

/// Concurrent ListResources share one fetch (`ttlMs: 0`: no reuse, but
/// requests that arrive while a fetch runs wait for it): eight at once
/// cost one `resources/list` (two, should one arrive just after).
#[tokio::test]
async fn concurrent_listings_share_one_fetch() {
    let env = [
        ("RESOURCES_TTL_MS", "\"0\""),
        ("RESOURCES_LIST_DELAY_MS", "\"400\""),
    ];
    let yaml = tenant(&py_server("py", "discover", &env, ""), "");
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    wait_resources(&mut client, "py").await;
    let before = counts(&mut client, "py").await["list"].as_u64().unwrap();
    let listings = (0..8).map(|_| {
        let mut client = client.clone();
        async move {
            list_resources(&mut client, pb::ListResourcesRequest::default())
                .await
                .unwrap()
        }
    });
    for listing in futures::future::join_all(listings).await {
        assert!(uris(&listing).contains(&"fixture://text"));
    }
    let after = counts(&mut client, "py").await["list"].as_u64().unwrap();
    assert!(
        (1..=2).contains(&(after - before)),
        "eight concurrent listings made {} fetches",
        after - before
    );
    gateway.shutdown().await;
}

/// `message` as the tenant acting for end user `alice`.
fn as_alice<T>(message: T) -> tonic::Request<T> {
    let mut request = authed(TOKEN, message);
    request
        .metadata_mut()
        .insert("x-toolgate-subject", "alice".parse().unwrap());
    request
}

/// A per-user (OAuth `authorization_code`) server is listed and read on
/// the subject's own session: before consent, ListResources shows that
/// subject's authorization URL and ReadResource is
/// UPSTREAM_AUTHORIZATION_REQUIRED with it; after consent the read reaches
/// the server on the subject's session (the OAuth fixture lists no
/// resources: RESOURCE_NOT_FOUND, from the server's -32602) and the
/// listing shows the server connected.
#[tokio::test]
async fn per_user_servers_use_the_subjects_session() {
    use crate::oauth::{authorization_url, config, consent, env, unconfirmed, upstream};
    let upstream = upstream(3600);
    let dir = tempfile::tempdir().unwrap();
    let state_url = format!("sqlite://{}/state.db", dir.path().display());
    let consent_port = free_port();
    let yaml = unconfirmed(&config(&upstream, &state_url, consent_port));
    let gateway = TestGateway::start(&yaml, &env()).await;
    let mut client = gateway.client().await;
    let read_docs = || {
        as_alice(pb::ReadResourceRequest {
            server: "docs".to_owned(),
            uri: "docs://any".to_owned(),
            ..Default::default()
        })
    };
    let listing = client
        .list_resources(as_alice(pb::ListResourcesRequest::default()))
        .await
        .unwrap()
        .into_inner();
    let docs = listing
        .servers
        .iter()
        .find(|s| s.name == "docs")
        .unwrap_or_else(|| panic!("{listing:?}"));
    assert_eq!(
        docs.state,
        i32::from(pb::ServerState::AuthorizationRequired),
        "{docs:?}"
    );
    assert!(!docs.authorization_url.is_empty());
    let refused = client.read_resource(read_docs()).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert_eq!(reason(&refused), "UPSTREAM_AUTHORIZATION_REQUIRED");
    let url = authorization_url(&refused);
    let (code, page) = consent(&url, "alice", consent_port).await;
    assert_eq!(code, 200, "{page}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let missing = loop {
        let status = client.read_resource(read_docs()).await.unwrap_err();
        if status.code() != Code::Unavailable || std::time::Instant::now() > deadline {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(reason(&missing), "RESOURCE_NOT_FOUND", "{missing:?}");
    let listing = client
        .list_resources(as_alice(pb::ListResourcesRequest::default()))
        .await
        .unwrap()
        .into_inner();
    let docs = listing.servers.iter().find(|s| s.name == "docs").unwrap();
    assert_eq!(
        docs.state,
        i32::from(pb::ServerState::Connected),
        "{docs:?}"
    );
    assert!(docs.authorization_url.is_empty() && docs.error.is_empty());
    gateway.shutdown().await;
}

/// A server whose list breaks `limits.max_resources_per_server` (resources
/// and templates together) has its resources refused, the status saying
/// which bound; its reads still work (they need no list).
#[tokio::test]
async fn a_list_over_the_bound_is_refused_with_its_reason() {
    let yaml = tenant(
        &py_server("py", "initialize", &[], ""),
        "limits:\n  max_resources_per_server: 11\n",
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    let started = std::time::Instant::now();
    let status = loop {
        let listing = list_resources(&mut client, pb::ListResourcesRequest::default())
            .await
            .unwrap();
        if let Some(status) = listing.servers.iter().find(|s| !s.error.is_empty()) {
            assert!(listing.resources.is_empty() && listing.resource_templates.is_empty());
            break status.clone();
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{listing:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        status.error.contains("limits.max_resources_per_server"),
        "{status:?}"
    );
    let hello = read(&mut client, "py", "fixture://text").await.unwrap();
    assert_eq!(text(&hello), "hello from resources");
    gateway.shutdown().await;
}

/// A read whose response is over `limits.max_message_bytes` is refused
/// (RESOURCE_EXHAUSTED / RESULT_TOO_LARGE), one under it is not.
#[tokio::test]
async fn a_read_over_max_message_bytes_is_refused() {
    let yaml = tenant(
        &py_server("py", "initialize", &[], ""),
        "limits:\n  max_message_bytes: 600000\n",
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    wait_resources(&mut client, "py").await;
    let big = read(&mut client, "py", "fixture://big-text")
        .await
        .unwrap_err();
    assert_eq!(big.code(), Code::ResourceExhausted, "{big:?}");
    assert_eq!(reason(&big), "RESULT_TOO_LARGE");
    assert!(big.message().contains("max_message_bytes"), "{big:?}");
    read(&mut client, "py", "fixture://text").await.unwrap();
    gateway.shutdown().await;
}

/// `ttlMs` (2026-07-28): the listing is reused while it is fresh and read
/// again once it is not.
#[tokio::test]
async fn a_listing_is_read_again_when_its_ttl_ends() {
    let yaml = tenant(
        &py_server("py", "discover", &[("RESOURCES_TTL_MS", "\"3000\"")], ""),
        "",
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    wait_resources(&mut client, "py").await;
    let list_count = |client: &mut ToolGatewayClient<Channel>| {
        let mut client = client.clone();
        async move {
            list_resources(&mut client, pb::ListResourcesRequest::default())
                .await
                .unwrap();
            counts(&mut client, "py").await["list"].as_u64().unwrap()
        }
    };
    // Until a listing has just been read (the listen stream's first
    // acknowledgement also ends the first one).
    let started = std::time::Instant::now();
    let mut last = list_count(&mut client).await;
    let fetched = loop {
        let now = list_count(&mut client).await;
        if now != last {
            break now;
        }
        last = now;
        assert!(started.elapsed() < Duration::from_secs(30));
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let fetched_at = std::time::Instant::now();
    assert_eq!(list_count(&mut client).await, fetched, "reused while fresh");
    let refetched = loop {
        let now = list_count(&mut client).await;
        if now > fetched {
            break fetched_at.elapsed();
        }
        assert!(
            fetched_at.elapsed() < Duration::from_secs(30),
            "never read again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(refetched >= Duration::from_secs(2), "{refetched:?}");
    gateway.shutdown().await;
}
