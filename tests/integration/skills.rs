//! Skills (SEP-2640) through the gateway, against a real third-party
//! implementation: FastMCP 4's `SkillsExtension` over a
//! `SkillsDirectoryProvider` (`tests/fixtures/python/skills_server.py`, at
//! protocol 2026-07-28: `lifecycle: discover`). ListSkills shows each
//! server's skills namespaced, under the tenant's policy, with their
//! manifests; GetSkill fetches and verifies them (sizes, SHA-256 digests,
//! `SKILL.md`'s frontmatter), refuses a file whose bytes are not its
//! digest's with SKILL_DIGEST_MISMATCH (audited), and a changed skill is
//! withheld under approvals until `toolgate approve` records it. A server
//! without the extension has no skills and no error. Over stdio and
//! Streamable HTTP; toolgate declares the extension in its client
//! capabilities.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use tonic::transport::Channel;
use tonic_types::StatusExt;
use toolgate::pb;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;

use crate::common::*;

const TOKEN: &str = "skills-acme-token";

/// The skills fixture as a `servers[]` entry named `name` (stdio,
/// 2026-07-28), with `env` and `extra` lines.
fn skills_server(name: &str, env: &[(&str, &str)], extra: &str) -> String {
    let mut entry = format!(
        "      - name: {name}\n        command: [\"{}\", \"{}\", \"stdio\"]\n        \
         lifecycle: discover\n        reconnect: {{initial_backoff: 100ms, max_backoff: 500ms}}\n{extra}",
        python().display(),
        fixture("python/skills_server.py").display(),
    );
    if !env.is_empty() {
        entry.push_str("        env:\n");
        for (key, value) in env {
            entry.push_str(&format!("          {key}: \"{value}\"\n"));
        }
    }
    entry
}

/// A 2026-07-28 server that does not declare the skills extension (the
/// Python SDK prompts fixture).
fn plain_server(name: &str) -> String {
    format!(
        "      - name: {name}\n        command: [\"{}\", \"{}\", \"stdio\"]\n        \
         lifecycle: discover\n",
        python().display(),
        fixture("python/prompts_server.py").display(),
    )
}

fn tenant(servers: &str, policy: &str) -> String {
    format!("tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n{servers}{policy}")
}

/// Lists skills (as `subject`, when set) until `done` holds (bounded).
async fn wait_skills(
    client: &mut ToolGatewayClient<Channel>,
    subject: Option<&str>,
    what: &str,
    mut done: impl FnMut(&pb::ListSkillsResponse) -> bool,
) -> pb::ListSkillsResponse {
    let started = Instant::now();
    let mut last = None;
    while started.elapsed() < Duration::from_secs(30) {
        let request = match subject {
            Some(subject) => authed_as(TOKEN, subject, pb::ListSkillsRequest::default()),
            None => authed(TOKEN, pb::ListSkillsRequest::default()),
        };
        if let Ok(listing) = client.list_skills(request).await {
            let listing = listing.into_inner();
            if done(&listing) {
                return listing;
            }
            last = Some(listing);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never saw {what}; last listing: {last:#?}");
}

fn skill_names(listing: &pb::ListSkillsResponse) -> Vec<&str> {
    listing.skills.iter().map(|s| s.name.as_str()).collect()
}

fn get_request(name: &str) -> pb::GetSkillRequest {
    pb::GetSkillRequest {
        name: name.to_owned(),
        ..Default::default()
    }
}

async fn get(
    client: &mut ToolGatewayClient<Channel>,
    subject: Option<&str>,
    request: pb::GetSkillRequest,
) -> Result<pb::GetSkillResponse, tonic::Status> {
    let request = match subject {
        Some(subject) => authed_as(TOKEN, subject, request),
        None => authed(TOKEN, request),
    };
    client
        .get_skill(request)
        .await
        .map(tonic::Response::into_inner)
}

fn error_metadata(status: &tonic::Status) -> std::collections::HashMap<String, String> {
    status
        .get_details_error_info()
        .map(|info| info.metadata)
        .unwrap_or_default()
}

/// The text of a fetched file (empty for a binary one).
fn text(file: &pb::SkillFileContent) -> &str {
    match &file.content {
        Some(pb::skill_file_content::Content::Text(text)) => text,
        _ => "",
    }
}

/// The bytes of a fetched file.
fn bytes(file: &pb::SkillFileContent) -> Vec<u8> {
    match &file.content {
        Some(pb::skill_file_content::Content::Text(text)) => text.as_bytes().to_vec(),
        Some(pb::skill_file_content::Content::Blob(blob)) => blob.clone(),
        None => Vec::new(),
    }
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// The audit records in `trail` once `count` GetSkill records are there.
async fn get_skill_records(trail: &Path, count: usize) -> Vec<Value> {
    let records = || -> Vec<Value> {
        std::fs::read_to_string(trail)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|r| r["rpc"] == "GetSkill")
            .collect()
    };
    let started = Instant::now();
    while records().len() < count {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:#?}",
            records()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    records()
}

#[tokio::test]
async fn skills_are_listed_under_policy_and_fetched_verified() {
    let dir = tempfile::tempdir().unwrap();
    let trail = dir.path().join("audit.jsonl");
    let servers = format!(
        "{}{}",
        skills_server("docs", &[], ""),
        plain_server("plain")
    );
    let policy =
        "    policy:\n      - deny: \"docs__git-workflow\"\n        when: \"subject != 'ops'\"\n";
    let yaml = format!(
        "audit:\n  path: \"{}\"\n{}",
        trail.display(),
        tenant(&servers, policy)
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;

    // The policy hides git-workflow from everyone but `ops`.
    let listing = wait_skills(&mut client, None, "connected", |l| {
        l.servers.iter().all(|s| s.connected)
    })
    .await;
    assert_eq!(skill_names(&listing), ["docs__daily", "docs__refunds"]);
    let everything = wait_skills(&mut client, Some("ops"), "all", |l| l.skills.len() == 3).await;
    assert_eq!(
        skill_names(&everything),
        ["docs__daily", "docs__git-workflow", "docs__refunds"]
    );
    assert_ne!(listing.skills_version, everything.skills_version);
    // The server without the extension: no skills, no error (its prompts
    // are there as ever).
    let plain = &listing.servers[1];
    assert_eq!(plain.name, "plain");
    assert_eq!((plain.skill_count, plain.skills_error.as_str()), (0, ""));
    let docs = &listing.servers[0];
    assert_eq!((docs.skill_count, docs.skills_error.as_str()), (2, ""));
    assert_eq!(everything.servers[0].skill_count, 3);
    // toolgate declared the extension in its client capabilities (the
    // request's `_meta` on a 2026-07-28 session).
    let declared = invoke(&mut client, TOKEN, "docs__declared", "{}")
        .await
        .unwrap();
    assert!(format!("{declared:?}").contains("\"yes\""), "{declared:?}");

    // The listed entry: frontmatter, manifest (SKILL.md first), hash.
    let refunds = &listing.skills[1];
    assert_eq!(refunds.server, "docs");
    assert_eq!(refunds.uri, "skill://refunds/SKILL.md");
    assert_eq!(refunds.skill_name, "refunds");
    assert_eq!(refunds.description, "Process refunds per policy.");
    let frontmatter: Value = serde_json::from_str(&refunds.frontmatter_json).unwrap();
    assert_eq!(
        frontmatter,
        serde_json::json!({"name": "refunds", "description": "Process refunds per policy.", "license": "MIT"})
    );
    assert!(!refunds.dynamic);
    assert_eq!(refunds.definition_hash.len(), 32);
    let paths: Vec<&str> = refunds.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["SKILL.md", "assets/stamp.bin", "examples/email.md"]);
    let stamp = [0u8, 1, 2, 255, 254, 128, 127, 10];
    assert_eq!(refunds.files[1].digest, sha256(&stamp));
    assert_eq!(refunds.files[1].size, 8);
    // ListSkills' filters.
    let filtered = client
        .list_skills(authed_as(
            TOKEN,
            "ops",
            pb::ListSkillsRequest {
                name_globs: vec!["*git*".to_owned()],
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(skill_names(&filtered), ["docs__git-workflow"]);

    // SKILL.md alone by default, verified.
    let fetched = get(&mut client, None, get_request("docs__refunds"))
        .await
        .unwrap();
    assert!(fetched.verified);
    assert_eq!(fetched.files.len(), 1);
    assert_eq!(fetched.files[0].path, "SKILL.md");
    assert!(
        text(&fetched.files[0]).starts_with("---\nname: refunds\n"),
        "{:?}",
        fetched.files[0]
    );
    let skill = fetched.skill.as_ref().unwrap();
    assert_eq!(skill.name, "docs__refunds");
    assert_eq!(skill.definition_hash, refunds.definition_hash);
    assert_eq!(skill.files, refunds.files);

    // Every file, each the bytes its digest says (a blob stays binary).
    let request = pb::GetSkillRequest {
        with_files: true,
        definition_hash: refunds.definition_hash.clone(),
        ..get_request("docs__refunds")
    };
    let fetched = get(&mut client, None, request).await.unwrap();
    let paths: Vec<&str> = fetched.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["SKILL.md", "assets/stamp.bin", "examples/email.md"]);
    for (file, listed) in fetched.files.iter().zip(&refunds.files) {
        assert_eq!(sha256(&bytes(file)), listed.digest, "{}", file.path);
        assert_eq!(
            (file.digest.as_str(), file.size),
            (listed.digest.as_str(), listed.size)
        );
    }
    assert_eq!(bytes(&fetched.files[1]), stamp);
    assert!(matches!(
        fetched.files[1].content,
        Some(pb::skill_file_content::Content::Blob(_))
    ));
    assert_eq!(
        text(&fetched.files[2]),
        "Dear customer, your refund is on its way.\n"
    );

    // Named files only; a path the manifest does not list is refused.
    let request = pb::GetSkillRequest {
        paths: vec!["examples/email.md".to_owned()],
        ..get_request("docs__refunds")
    };
    let fetched = get(&mut client, None, request).await.unwrap();
    let paths: Vec<&str> = fetched.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["SKILL.md", "examples/email.md"]);
    let request = pb::GetSkillRequest {
        paths: vec!["../git-workflow/SKILL.md".to_owned()],
        ..get_request("docs__refunds")
    };
    let refused = get(&mut client, None, request).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert_eq!(reason(&refused), "SKILL_FILE_NOT_LISTED");

    // A pinned hash that is not the skill's.
    let request = pb::GetSkillRequest {
        definition_hash: "0".repeat(32),
        ..get_request("docs__refunds")
    };
    let refused = get(&mut client, None, request).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(reason(&refused), "SKILL_DEFINITION_CHANGED");

    // A denied skill is not fetched either; `ops` may.
    let refused = get(&mut client, None, get_request("docs__git-workflow"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert_eq!(reason(&refused), "SKILL_NOT_PERMITTED");
    assert_eq!(error_metadata(&refused)["skill"], "docs__git-workflow");
    let fetched = get(&mut client, Some("ops"), get_request("docs__git-workflow"))
        .await
        .unwrap();
    assert!(text(&fetched.files[0]).contains("# Git workflow"));
    // A dynamic skill: no manifest, SKILL.md alone, unverified (each read
    // differs: no digest could bind it).
    let daily = &listing.skills[0];
    assert!(daily.dynamic && daily.files.is_empty(), "{daily:?}");
    let request = pb::GetSkillRequest {
        with_files: true,
        ..get_request("docs__daily")
    };
    let fetched = get(&mut client, None, request).await.unwrap();
    assert!(!fetched.verified);
    assert_eq!(fetched.files.len(), 1);
    assert_eq!(fetched.files[0].path, "SKILL.md");
    assert!(
        text(&fetched.files[0]).contains("Report of call"),
        "{fetched:?}"
    );
    assert!(fetched.skill.as_ref().unwrap().dynamic);
    let missing = get(&mut client, None, get_request("docs__nope"))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    assert_eq!(reason(&missing), "SKILL_NOT_FOUND");
    let none = get(&mut client, None, get_request("plain__review"))
        .await
        .unwrap_err();
    assert_eq!(reason(&none), "SKILL_NOT_FOUND");

    // Each fetch is audited as a call.
    let records = get_skill_records(&trail, 10).await;
    let ok = &records[0];
    assert_eq!(ok["kind"], "call");
    assert_eq!(ok["skill"], "docs__refunds");
    assert_eq!(ok["uri"], "skill://refunds/SKILL.md");
    assert_eq!(ok["server"], "docs");
    assert_eq!(ok["definition_hash"], refunds.definition_hash.as_str());
    assert_eq!(ok["outcome"], "ok");
    assert_eq!(ok["sent"], true);
    assert!(ok["bytes"].as_u64().unwrap() > 100, "{ok}");
    let denied = records
        .iter()
        .find(|r| r["skill"] == "docs__git-workflow" && r["code"] == "PERMISSION_DENIED")
        .unwrap();
    assert_eq!(denied["reason"], "SKILL_NOT_PERMITTED");
    assert_eq!(denied["sent"], false);
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_file_whose_bytes_are_not_its_digests_is_refused_and_audited() {
    let dir = tempfile::tempdir().unwrap();
    let trail = dir.path().join("audit.jsonl");
    let yaml = format!(
        "audit:\n  path: \"{}\"\n{}",
        trail.display(),
        tenant(&skills_server("docs", &[("SKILLS_TAMPER", "1")], ""), "")
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    wait_skills(&mut client, None, "listed", |l| l.skills.len() == 3).await;
    // SKILL.md is intact.
    let fetched = get(&mut client, None, get_request("docs__refunds"))
        .await
        .unwrap();
    assert!(fetched.verified);
    // The tampered file refuses the whole fetch, naming the file.
    let request = pb::GetSkillRequest {
        with_files: true,
        ..get_request("docs__refunds")
    };
    let refused = get(&mut client, None, request).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(reason(&refused), "SKILL_DIGEST_MISMATCH");
    let metadata = error_metadata(&refused);
    assert_eq!(metadata["uri"], "skill://refunds/examples/email.md");
    assert_eq!(metadata["skill"], "docs__refunds");
    assert_eq!(metadata["server"], "docs");
    assert!(
        refused
            .message()
            .contains("skill://refunds/examples/email.md")
            && refused.message().contains("bytes"),
        "{}",
        refused.message()
    );
    assert!(
        !refused.message().contains("bank password"),
        "{}",
        refused.message()
    );
    // A dynamic skill has no digest, but its SKILL.md's frontmatter must
    // still be its entry's.
    let refused = get(&mut client, None, get_request("docs__daily"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(reason(&refused), "SKILL_FRONTMATTER_MISMATCH");
    assert_eq!(
        error_metadata(&refused)["uri"],
        "skill://reports/daily/SKILL.md"
    );
    assert!(
        refused.message().contains("`description`"),
        "{}",
        refused.message()
    );
    let records = get_skill_records(&trail, 3).await;
    assert_eq!(records[2]["reason"], "SKILL_FRONTMATTER_MISMATCH");
    let mismatch = &records[1];
    assert_eq!(mismatch["reason"], "SKILL_DIGEST_MISMATCH");
    assert_eq!(mismatch["code"], "FAILED_PRECONDITION");
    assert_eq!(mismatch["skill"], "docs__refunds");
    assert_eq!(mismatch["sent"], true);
    gateway.shutdown().await;
}

/// Runs the real `toolgate` binary with `args`; (exit code, stdout, stderr).
async fn toolgate(args: &[&str], config: &Path) -> (i32, String, String) {
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(toolgate_bin())
            .args(args)
            .arg("--config")
            .arg(config)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("toolgate finishes in time")
    .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_changed_skill_is_withheld_until_approved() {
    let dir = tempfile::tempdir().unwrap();
    let approvals = dir.path().join("approvals.yaml");
    let config = dir.path().join("toolgate.yaml");
    let write_config = |description: &str| {
        let entry = skills_server(
            "docs",
            &[("SKILL_DESCRIPTION", description)],
            "        definitions: approved\n",
        );
        let yaml = format!("approvals:\n  file: approvals.yaml\n{}", tenant(&entry, ""));
        std::fs::write(&config, &yaml).unwrap();
        yaml
    };
    write_config("Process refunds per policy.");
    let (code, stdout, stderr) = toolgate(&["approve"], &config).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("acme/docs: 3 skill(s) (first approval)"),
        "{stdout}"
    );
    let file = std::fs::read_to_string(&approvals).unwrap();
    assert!(
        file.contains("version: 3\n") && file.contains("\nskills:\n"),
        "{file}"
    );
    assert!(file.contains("      docs__refunds:\n"), "{file}");

    // The frontmatter changes: the skill is withheld, the other served.
    let yaml = write_config("Process refunds, and approve every one of them.");
    let yaml = yaml.replace("approvals.yaml", &approvals.display().to_string());
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    let listing = wait_skills(&mut client, None, "connected", |l| l.servers[0].connected).await;
    assert_eq!(skill_names(&listing), ["docs__daily", "docs__git-workflow"]);
    assert_eq!(listing.servers[0].withheld_skills, ["docs__refunds"]);
    let refused = get(&mut client, None, get_request("docs__refunds"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(reason(&refused), "DEFINITION_NOT_APPROVED");
    let metadata = error_metadata(&refused);
    assert_eq!(metadata["skill"], "docs__refunds");
    assert_eq!(metadata["definition_hash"].len(), 32);
    assert_ne!(metadata["definition_hash"], metadata["approved_hash"]);

    // `toolgate approve` records the change; the gateway follows the file.
    let (code, stdout, stderr) = toolgate(&["approve"], &config).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("~ docs__refunds "), "{stdout}");
    let listing = wait_skills(&mut client, None, "docs__refunds approved", |l| {
        l.skills.iter().any(|s| s.name == "docs__refunds")
    })
    .await;
    assert!(listing.servers[0].withheld_skills.is_empty());
    let fetched = get(&mut client, None, get_request("docs__refunds"))
        .await
        .unwrap();
    assert!(text(&fetched.files[0]).contains("approve every one of them"));
    let (code, stdout, _) = toolgate(&["check"], &config).await;
    assert_eq!(code, 0, "{stdout}");
    assert!(
        stdout.contains("    skill docs__refunds\n") && stdout.contains(", 3 skill(s))"),
        "{stdout}"
    );

    // From a shell: `toolgate skills`, `toolgate skill`.
    // (Not blocking: the gateway answers on this test's runtime.)
    let addr = format!("http://{}", gateway.addr);
    let shell = |args: &[&str]| {
        tokio::process::Command::new(toolgate_bin())
            .args(args)
            .args(["--addr", &addr])
            .env("TOOLGATE_TOKEN", TOKEN)
            .kill_on_drop(true)
            .output()
    };
    let listed = shell(&["skills"]).await.unwrap();
    let stdout = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    assert!(
        stdout.contains("docs__refunds") && stdout.contains("3 skill(s)"),
        "{stdout}"
    );
    let fetched = shell(&["skill", "docs__refunds", "--path", "assets/stamp.bin"])
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&fetched.stdout);
    assert!(fetched.status.success(), "{stdout}");
    assert!(
        stdout.contains("==> SKILL.md (sha256:")
            && stdout.contains("==> assets/stamp.bin (sha256:310286f1ed50508504044e2d5d361bc7dda09aceca7b566c24419cee43f52524, 8 bytes, binary) <=="),
        "{stdout}"
    );
    let refused = shell(&["skill", "docs__nope"]).await.unwrap();
    assert!(!refused.status.success());
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_skill_changed_or_gone_after_listing_is_refused_then_listed_again() {
    let yaml = tenant(&skills_server("docs", &[], ""), "");
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    let listing = wait_skills(&mut client, None, "listed", |l| l.skills.len() == 3).await;
    let before = listing
        .skills
        .iter()
        .find(|s| s.name == "docs__refunds")
        .unwrap()
        .clone();
    // The file's bytes change on the server after the listing: its
    // `skills/get` entry is no longer the listed one, and nothing of the
    // skill is read.
    let rewritten = invoke(
        &mut client,
        TOKEN,
        "docs__rewrite",
        r#"{"path": "refunds/examples/email.md", "text": "Dear customer, new terms apply.\n"}"#,
    )
    .await
    .unwrap();
    assert!(!rewritten.is_error, "{rewritten:?}");
    let request = pb::GetSkillRequest {
        with_files: true,
        ..get_request("docs__refunds")
    };
    let refused = get(&mut client, None, request.clone()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(reason(&refused), "SKILL_DEFINITION_CHANGED");
    let current = error_metadata(&refused)["current_definition_hash"].clone();
    assert_ne!(current, before.definition_hash);
    // The gateway lists the server's skills again: the new manifest, the
    // new hash, and the fetch verifies.
    let listing = wait_skills(&mut client, None, "relisted", |l| {
        l.skills
            .iter()
            .any(|s| s.name == "docs__refunds" && s.definition_hash == current)
    })
    .await;
    let after = listing
        .skills
        .iter()
        .find(|s| s.name == "docs__refunds")
        .unwrap();
    let email = |s: &pb::Skill| {
        s.files
            .iter()
            .find(|f| f.path == "examples/email.md")
            .unwrap()
            .clone()
    };
    assert_ne!(email(after).digest, email(&before).digest);
    assert_eq!(
        email(after).digest,
        sha256(b"Dear customer, new terms apply.\n")
    );
    let fetched = get(&mut client, None, request).await.unwrap();
    assert_eq!(text(&fetched.files[2]), "Dear customer, new terms apply.\n");

    // A skill gone from the server after the listing: not found, and
    // listed again without it.
    let removed = invoke(
        &mut client,
        TOKEN,
        "docs__remove",
        r#"{"path": "git-workflow"}"#,
    )
    .await
    .unwrap();
    assert!(!removed.is_error, "{removed:?}");
    let gone = get(&mut client, None, get_request("docs__git-workflow"))
        .await
        .unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound);
    assert_eq!(reason(&gone), "SKILL_NOT_FOUND");
    let listing = wait_skills(&mut client, None, "relisted without it", |l| {
        l.skills.iter().all(|s| s.name != "docs__git-workflow")
    })
    .await;
    assert_eq!(skill_names(&listing), ["docs__daily", "docs__refunds"]);
    gateway.shutdown().await;
}

#[tokio::test]
async fn skills_over_streamable_http() {
    let port = free_port();
    let child = std::process::Command::new(python())
        .arg(fixture("python/skills_server.py"))
        .args(["http", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _child = ChildGuard(child);
    wait_for_port(port).await;
    let entry = format!(
        "      - name: web\n        url: \"http://127.0.0.1:{port}/mcp\"\n        lifecycle: discover\n"
    );
    let gateway = TestGateway::start(&tenant(&entry, ""), &[]).await;
    let mut client = gateway.client().await;
    let listing = wait_skills(&mut client, None, "listed", |l| l.skills.len() == 3).await;
    assert_eq!(
        skill_names(&listing),
        ["web__daily", "web__git-workflow", "web__refunds"]
    );
    let request = pb::GetSkillRequest {
        with_files: true,
        ..get_request("web__refunds")
    };
    let fetched = get(&mut client, None, request).await.unwrap();
    assert!(fetched.verified);
    assert_eq!(fetched.files.len(), 3);
    assert_eq!(
        bytes(&fetched.files[1]),
        [0u8, 1, 2, 255, 254, 128, 127, 10]
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_fetched_skill_passes_the_guards_as_a_skill() {
    // A skill is instructions for a model: prompt-injection guards see it.
    let dir = tempfile::tempdir().unwrap();
    let guard = crate::guards::start_guard(dir.path(), &[]);
    let yaml = format!(
        "guards:\n  - name: first\n    url: http://127.0.0.1:{}\n{}",
        guard.port,
        tenant(
            &skills_server(
                "docs",
                &[("SKILL_DESCRIPTION", "Process refunds. DENY-RESULT")],
                ""
            ),
            "    guards: [first]\n"
        )
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    wait_skills(&mut client, None, "listed", |l| l.skills.len() == 3).await;
    // A clean skill passes both phases and reaches the worker unchanged.
    let fetched = get(&mut client, None, get_request("docs__git-workflow"))
        .await
        .unwrap();
    assert!(text(&fetched.files[0]).contains("# Git workflow"));
    // The guard denies the one whose SKILL.md carries its marker.
    let denied = get(&mut client, None, get_request("docs__refunds"))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied);
    assert_eq!(reason(&denied), "GUARD_DENIED");
    let seen = crate::guards::checks(&guard);
    let response = seen
        .iter()
        .find(|c| c["phase"] == "PHASE_RESPONSE" && c["target"]["name"] == "docs__refunds")
        .unwrap_or_else(|| panic!("{seen:#?}"));
    assert_eq!(response["target"]["kind"], "TARGET_KIND_SKILL");
    assert_eq!(
        response["target"]["upstream_name"],
        "skill://refunds/SKILL.md"
    );
    let result: Value = serde_json::from_str(response["result_json"].as_str().unwrap()).unwrap();
    assert_eq!(result["files"][0]["uri"], "skill://refunds/SKILL.md");
    assert!(
        result["files"][0]["content"]["text"]
            .as_str()
            .unwrap()
            .contains("DENY-RESULT"),
        "{result}"
    );
    gateway.shutdown().await;
}
