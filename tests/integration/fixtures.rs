//! The test fixtures check themselves: each self-check script drives its
//! fixture as documented (the mcp SDK's own client, raw JSON-RPC, raw
//! OAuth flows) and exits non-zero on the first check that fails, so a
//! fixture that drifts from what the Rust tests assume fails here first.

use std::time::Duration;

use crate::common::*;

/// Runs `script` (under `tests/fixtures/`) with the tests' Python and
/// `args`, bounded; fails with its output unless it exits 0.
async fn self_check(script: &str, args: &[&str]) {
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(python())
            .arg(fixture(script))
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{script} {args:?} did not finish in 120 s"))
    .unwrap();
    assert!(
        output.status.success(),
        "{script} {args:?} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn the_env_server_checks_itself_over_stdio() {
    self_check("python/check_env_server.py", &[]).await;
}

#[tokio::test]
async fn the_env_server_checks_itself_over_http() {
    self_check("python/check_env_server.py", &["--http"]).await;
}

#[tokio::test]
async fn the_skills_server_checks_itself() {
    self_check("python/check_skills_server.py", &[]).await;
}

#[tokio::test]
async fn the_hostile_server_misbehaves_as_documented() {
    self_check("python/check_hostile_server.py", &[]).await;
}

#[tokio::test]
async fn the_oauth_fixtures_check_themselves() {
    self_check("python/check_oauth_fixtures.py", &[]).await;
}

#[tokio::test]
async fn the_search_catalog_is_well_formed() {
    self_check("catalog/check_catalog.py", &[]).await;
}
