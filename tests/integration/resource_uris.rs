//! Resource URIs are normalized before the resource rules match them, and
//! the server is sent the form that was matched (issue 37, item 2). Against
//! `resources_server.py` with `RESOURCES_FILES=1` (a server that lists and
//! links `file:` URIs spelled with dot segments, `localhost`, upper case and
//! escapes, and answers a read with the URI exactly as it received it),
//! under the worked example of docs/governance.md: every bypass spelling of
//! the issue is refused (`INVALID_ARGUMENT` / `INVALID_RESOURCE_URI`) or
//! denied (`PERMISSION_DENIED` / `RESOURCE_NOT_PERMITTED`) through
//! ReadResource, WatchResource and Complete, with nothing sent; listings
//! hide what a normalized URI denies; allowed reads and a tool's link reach
//! the server normalized.

use tonic::Code;
use tonic_types::StatusExt;
use toolgate::pb;

use super::resources::{
    TOKEN, counts, list_resources, py_server, read, tenant, text, uris, wait_resources,
};
use crate::common::*;

/// docs/governance.md, "Prompts and resources": no caller reads files
/// outside /srv/public, on any server.
const POLICY: &str = "    policy:\n      - allow_resources: \"*:file:///srv/public/**\"\n      - deny_resources: \"*:file:///**\"\n";

/// Spellings of `file:///srv/secret/key` that a server resolves to it.
const DENIED: [&str; 8] = [
    "file:///srv/secret/key",
    "file:///srv/public/../secret/key",
    "file:///srv/public/%2e%2e/secret/key",
    "file:///srv/public/%2E%2E/secret/key",
    "file:///srv/public/.%2e/secret/key",
    "file://localhost/srv/secret/key",
    "FILE:///srv/secret/key",
    "File://LOCALHOST/srv/public/sub/../../secret/key",
];

/// Spellings with no normal form a glob could match, and what is named.
const REFUSED: [(&str, &str, &str); 4] = [
    (
        "file:///srv/public/..%2fsecret/key",
        "encoded_separator",
        "encoded path separator `%2F` is refused",
    ),
    (
        "file:///srv/public/..%2Fsecret/key",
        "encoded_separator",
        "encoded path separator `%2F` is refused",
    ),
    (
        "file:///srv/public/..%5Csecret/key",
        "encoded_separator",
        "encoded path separator `%5C` is refused",
    ),
    (
        "file://evil/srv/secret/key",
        "file_host",
        "a file URI naming host `evil` is refused",
    ),
];

fn yaml() -> String {
    format!(
        "{}{POLICY}",
        tenant(
            &py_server("files", "initialize", &[("RESOURCES_FILES", "1")], ""),
            ""
        )
    )
}

/// Asserts `status` is `code` / `why` with `key` = `value` in its
/// `ErrorInfo`.
fn assert_status(status: &tonic::Status, code: Code, why: &str, key: &str, value: &str) {
    assert_eq!(status.code(), code, "{status:?}");
    assert_eq!(reason(status), why, "{status:?}");
    let info = status.get_details_error_info().expect("ErrorInfo");
    assert_eq!(
        info.metadata.get(key).map(String::as_str),
        Some(value),
        "{status:?}"
    );
}

/// Asserts `status` refuses `spelled` as having no normal form.
fn assert_refused(status: &tonic::Status, field: &str, refused: &str, message: &str) {
    assert_status(
        status,
        Code::InvalidArgument,
        "INVALID_RESOURCE_URI",
        "field",
        field,
    );
    assert_status(
        status,
        Code::InvalidArgument,
        "INVALID_RESOURCE_URI",
        "refused",
        refused,
    );
    assert!(status.message().contains(message), "{status:?}");
}

fn watch(uri: &str) -> tonic::Request<pb::WatchResourceRequest> {
    authed(
        TOKEN,
        pb::WatchResourceRequest {
            server: "files".to_owned(),
            uri: uri.to_owned(),
        },
    )
}

fn complete(uri_template: &str) -> tonic::Request<pb::CompleteRequest> {
    authed(
        TOKEN,
        pb::CompleteRequest {
            r#ref: Some(pb::complete_request::Ref::ResourceTemplate(
                pb::ResourceTemplateRef {
                    server: "files".to_owned(),
                    uri_template: uri_template.to_owned(),
                },
            )),
            argument_name: "name".to_owned(),
            value: "k".to_owned(),
            ..Default::default()
        },
    )
}

#[tokio::test]
async fn every_bypass_spelling_is_refused_or_denied_and_allowed_reads_reach_the_server_normalized()
{
    let gateway = TestGateway::start(&yaml(), &[]).await;
    let mut client = gateway.client().await;
    let listing = wait_resources(&mut client, "files").await;

    // Listings: in normal form, and what the normal form denies (or what
    // has none) is hidden.
    let listed = uris(&listing);
    let file_uris: Vec<&str> = listed
        .iter()
        .copied()
        .filter(|u| u.starts_with("file:"))
        .collect();
    assert_eq!(
        file_uris,
        [
            "file:///srv/public/readme.txt",
            "file:///srv/public/Upper.txt"
        ]
    );
    let templates: Vec<&str> = listing
        .resource_templates
        .iter()
        .map(|t| t.uri_template.as_str())
        .collect();
    assert!(
        templates.contains(&"file:///srv/public/{name}"),
        "{templates:?}"
    );
    assert!(
        !templates.iter().any(|t| t.contains("secret")),
        "{templates:?}"
    );
    let files = listing
        .servers
        .iter()
        .find(|s| s.name == "files")
        .expect("files listed");
    assert_eq!(files.resource_count as usize, listing.resources.len());

    // Allowed reads reach the server in normal form.
    let reads_before = counts(&mut client, "files").await["read"].as_u64().unwrap();
    for (spelled, received) in [
        (
            "file:///srv/public/readme.txt",
            "file:///srv/public/readme.txt",
        ),
        (
            "FILE://localhost/srv/public/sub/../%72eadme.txt",
            "file:///srv/public/readme.txt",
        ),
        (
            "file:///srv/public/%2e/Upper.txt",
            "file:///srv/public/Upper.txt",
        ),
    ] {
        let answer = read(&mut client, "files", spelled)
            .await
            .unwrap_or_else(|e| panic!("{spelled}: {e:?}"));
        assert_eq!(text(&answer), format!("read {received}"), "{spelled}");
    }
    let reads = |n: u64| reads_before + n;
    assert_eq!(
        counts(&mut client, "files").await["read"].as_u64(),
        Some(reads(3))
    );

    // Each bypass spelling: denied under its normal form, or refused.
    for spelled in DENIED {
        let status = read(&mut client, "files", spelled)
            .await
            .expect_err(spelled);
        assert_status(
            &status,
            Code::PermissionDenied,
            "RESOURCE_NOT_PERMITTED",
            "uri",
            "file:///srv/secret/key",
        );
        let status = client
            .watch_resource(watch(spelled))
            .await
            .expect_err(spelled);
        assert_status(
            &status,
            Code::PermissionDenied,
            "RESOURCE_NOT_PERMITTED",
            "uri",
            "file:///srv/secret/key",
        );
    }
    for (spelled, refused, message) in REFUSED {
        let status = read(&mut client, "files", spelled)
            .await
            .expect_err(spelled);
        assert_refused(&status, "uri", refused, message);
        let status = client
            .watch_resource(watch(spelled))
            .await
            .expect_err(spelled);
        assert_refused(&status, "uri", refused, message);
    }
    // Nothing of them reached the server.
    assert_eq!(
        counts(&mut client, "files").await["read"].as_u64(),
        Some(reads(3))
    );
    // An allowed watch passes the policy (this server offers no
    // subscriptions).
    let status = client
        .watch_resource(watch("FILE://localhost/srv/public/readme.txt"))
        .await
        .expect_err("no subscriptions");
    assert_eq!(reason(&status), "SUBSCRIBE_UNSUPPORTED", "{status:?}");

    // Complete: a template is matched in its normal form too.
    for spelled in [
        "file:///srv/public/../secret/{name}",
        "FILE://localhost/srv/public/%2e%2e/secret/{name}",
    ] {
        let status = client.complete(complete(spelled)).await.expect_err(spelled);
        assert_status(
            &status,
            Code::PermissionDenied,
            "RESOURCE_NOT_PERMITTED",
            "uri_template",
            "file:///srv/secret/{name}",
        );
    }
    let status = client
        .complete(complete("file:///srv/public/..%2F{name}"))
        .await
        .expect_err("encoded separator");
    assert_refused(
        &status,
        "uri_template",
        "encoded_separator",
        "resource uri template `file:///srv/public/..%2F{name}`: encoded path separator `%2F` is refused",
    );
    let status = client
        .complete(complete("FILE://localhost/srv/public/{name}"))
        .await
        .expect_err("this server does not complete");
    assert_eq!(reason(&status), "COMPLETION_UNSUPPORTED", "{status:?}");

    // A link a tool returns carries the normal form, and reading it sends
    // that form.
    let linked = invoke(&mut client, TOKEN, "files__link", "{}")
        .await
        .expect("link");
    let Some(pb::content::Kind::ResourceLink(link)) = &linked.content[0].kind else {
        panic!("not a link: {linked:?}");
    };
    assert_eq!(link.uri, "file:///srv/public/readme.txt");
    assert_eq!(link.server, "files");
    let answer = read(&mut client, "files", &link.uri)
        .await
        .expect("read link");
    assert_eq!(text(&answer), "read file:///srv/public/readme.txt");

    // The listing filter sees the normal form as well.
    let filtered = list_resources(
        &mut client,
        pb::ListResourcesRequest {
            uri_globs: vec!["file:///srv/public/U*".to_owned()],
            ..Default::default()
        },
    )
    .await
    .expect("filtered listing");
    assert_eq!(uris(&filtered), ["file:///srv/public/Upper.txt"]);
    gateway.shutdown().await;
}
