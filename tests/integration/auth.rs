//! Callers: bearer tokens select the tenant; tenants are isolated.

use crate::common::*;
use toolgate::pb;

async fn two_tenants() -> (McpServer, McpServer, TestGateway) {
    let a = serve_mcp(TestServer::new(&["echo", "secret_a"])).await;
    let b = serve_mcp(TestServer::new(&["echo"])).await;
    // Both tenants use a server of the same name: each gets its own session.
    let gateway = TestGateway::start(
        &format!(
            "tenants:\n  - name: acme\n    tokens: [{{ env: ACME_TOKEN }}]\n    servers:\n      - name: s\n        url: \"{}\"\n  - name: globex\n    tokens: [globex-token]\n    servers:\n      - name: s\n        url: \"{}\"\n",
            a.url, b.url
        ),
        &[("ACME_TOKEN", "acme-token")],
    )
    .await;
    (a, b, gateway)
}

#[tokio::test]
async fn missing_malformed_and_unknown_tokens_are_unauthenticated() {
    let (_a, _b, gateway) = two_tenants().await;
    let mut client = gateway.client().await;
    let err = client
        .list_tools(tonic::Request::new(pb::ListToolsRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let mut request = tonic::Request::new(pb::ListToolsRequest::default());
    request
        .metadata_mut()
        .insert("authorization", "Basic abc".parse().unwrap());
    let err = client.list_tools(request).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let err = client
        .list_tools(authed("acme-tokenX", pb::ListToolsRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let err = invoke(&mut client, "wrong", "s__echo", "{}")
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert_eq!(reason(&err), "UNAUTHENTICATED");
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_tenant_never_sees_or_reaches_another_tenants_tools() {
    let (a, b, gateway) = two_tenants().await;
    let mut client = gateway.client().await;
    assert_eq!(
        names(&list(&mut client, "acme-token").await),
        ["s__echo", "s__secret_a"]
    );
    assert_eq!(names(&list(&mut client, "globex-token").await), ["s__echo"]);
    let err = invoke(&mut client, "globex-token", "s__secret_a", "{}")
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    // Same exposed name, different tenants: each reaches its own server.
    let before_a = a.log.headers.lock().unwrap().len();
    let before_b = b.log.headers.lock().unwrap().len();
    invoke(&mut client, "globex-token", "s__echo", "{}")
        .await
        .unwrap();
    assert_eq!(a.log.headers.lock().unwrap().len(), before_a);
    assert!(b.log.headers.lock().unwrap().len() > before_b);
    gateway.shutdown().await;
}
