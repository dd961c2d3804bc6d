//! The documentation held to the code. docs/configuration.md's key tables
//! against the configuration parser: every key the parser accepts is
//! documented, every documented key is accepted, and a documented default
//! written as one literal loads to the same configuration as leaving the
//! key out. docs/errors.md's reasons against the status table the gateway
//! answers with.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use toolgate::config::Config;

use crate::common::*;

/// One row of a key table: its key(s), default cell and `applies to` cell.
#[derive(Debug, Clone)]
struct Row {
    keys: Vec<String>,
    default: String,
    applies: String,
}

/// The key tables of a page, by the heading above each (`## ...` or
/// `### ...`, without the `#`s).
fn key_tables(page: &str) -> BTreeMap<String, Vec<Row>> {
    let mut tables: BTreeMap<String, Vec<Row>> = BTreeMap::new();
    let mut heading = String::new();
    let mut columns: Option<Vec<String>> = None;
    for line in page.lines() {
        if let Some(title) = line
            .strip_prefix("## ")
            .or_else(|| line.strip_prefix("### "))
        {
            heading = title.trim().to_owned();
            columns = None;
            continue;
        }
        if !line.starts_with('|') {
            columns = None;
            continue;
        }
        let cells: Vec<String> = line
            .trim()
            .trim_matches('|')
            .split(" | ")
            .map(|c| c.trim().to_owned())
            .collect();
        match &columns {
            None if cells.first().is_some_and(|c| c == "key") => columns = Some(cells),
            None => {}
            Some(_) if cells[0].starts_with("---") => {}
            Some(names) => {
                let cell = |name: &str| {
                    names
                        .iter()
                        .position(|n| n == name)
                        .and_then(|i| cells.get(i))
                        .cloned()
                        .unwrap_or_default()
                };
                let keys = cell("key")
                    .split(", ")
                    .map(|k| k.trim_matches('`').to_owned())
                    .collect();
                tables.entry(heading.clone()).or_default().push(Row {
                    keys,
                    default: cell("default"),
                    applies: cell("applies to"),
                });
            }
        }
    }
    tables
}

const TENANT: &str = "{name: t, tokens: [tok]}";
/// A 32-byte key in base64.
const STATE_KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

/// A whole configuration with `entries` (`key: value` pairs) in the
/// section a key table describes; `None` for a table this test does not
/// know (which fails it: a new table needs its place here).
fn config_with(section: &str, entries: &[String], stdio: bool) -> Option<String> {
    let flow = entries.join(", ");
    let server = if stdio {
        "name: s, command: [/bin/true]"
    } else {
        "name: s, url: \"http://127.0.0.1:1/mcp\""
    };
    let tenants = format!("tenants: [{TENANT}]");
    Some(match section {
        "Top level" => {
            let lines = entries.join("\n");
            if entries.iter().any(|e| e.starts_with("tenants:")) {
                lines
            } else {
                format!("{lines}\n{tenants}")
            }
        }
        "`approvals`" => format!("approvals: {{file: approvals.yaml, {flow}}}\n{tenants}"),
        "`callers`" => {
            // An entry needs its `jwks`; one written by the probe keeps the URL.
            let url = "url: \"https://idp.example/jwks\"";
            let flow = if flow.contains("jwks: {") {
                flow.replace("jwks: {", &format!("jwks: {{{url}, "))
            } else {
                format!("jwks: {{{url}}}, {flow}")
            };
            format!(
                "callers: {{jwt: [{{issuer: \"https://idp.example\", audiences: [toolgate], tenant: \"'t'\", {flow}}}]}}\ntenants: [{{name: t}}]"
            )
        }
        "`callers.mtls[]`" => format!(
            "grpc: {{tls: {{cert_file: gw.pem, key_file: gw-key.pem, client_ca_file: ca.pem}}}}\ncallers: {{mtls: [{{tenant: \"'t'\", {flow}}}]}}\ntenants: [{{name: t}}]"
        ),
        "`audit`" => format!("audit: {{path: audit.jsonl, {flow}}}\n{tenants}"),
        "`metrics`" => format!("metrics: {{listen: \"127.0.0.1:0\", {flow}}}\n{tenants}"),
        "`grpc`" => format!("grpc: {{{flow}}}\n{tenants}"),
        "Listener TLS" => format!("grpc: {{tls: {{{flow}}}}}\n{tenants}"),
        "`limits`" => format!("limits: {{{flow}}}\n{tenants}"),
        "`sessions`" => format!("sessions: {{{flow}}}\n{tenants}"),
        "`defaults`" => format!("defaults: {{{flow}}}\n{tenants}"),
        "`tenants[]`" => format!("tenants: [{{name: t, tokens: [tok], {flow}}}]"),
        "`tenants[].policy[].approval`" => format!(
            "tenants: [{{name: t, tokens: [tok], policy: [{{require_approval: \"s__*\", approval: {{{flow}}}}}]}}]"
        ),
        "`tenants[].limits`" => {
            format!("tenants: [{{name: t, tokens: [tok], limits: {{{flow}}}}}]")
        }
        "`tenants[].limits.per_subject`" => {
            format!("tenants: [{{name: t, tokens: [tok], limits: {{per_subject: {{{flow}}}}}}}]")
        }
        "`tenants[].call_approvals`" => {
            format!("tenants: [{{name: t, tokens: [tok], call_approvals: {{{flow}}}}}]")
        }
        "`tenants[].idempotency`" => {
            format!("tenants: [{{name: t, tokens: [tok], idempotency: {{{flow}}}}}]")
        }
        "`tenants[].call_approvals.approver_tokens[]`" => format!(
            "tenants: [{{name: t, tokens: [tok], call_approvals: {{approver_tokens: [{{name: a, token: approver-tok, {flow}}}]}}}}]"
        ),
        "`tenants[].call_approvals.webhook`" => format!(
            "tenants: [{{name: t, tokens: [tok], call_approvals: {{webhook: {{url: \"https://hooks.example/h\", secret: a-webhook-secret-of-16-bytes, {flow}}}}}}}]"
        ),
        "`tenants[].servers[]`" => {
            format!("tenants: [{{name: t, tokens: [tok], servers: [{{{server}, {flow}}}]}}]")
        }
        "Overrides" => format!(
            "tenants: [{{name: t, tokens: [tok], servers: [{{{server}, overrides: {{search: {{{flow}}}}}}}]}}]"
        ),
        "State store" => format!("state: {{{flow}}}\n{tenants}"),
        "`tenants_dir`" => format!("tenants_dir: {{path: tenants.d, {flow}}}\n{tenants}"),
        "`admin`" => format!(
            "state: {{keys: [\"{STATE_KEY}\"]}}\nadmin: {{listen: \"127.0.0.1:0\", {flow}}}\n{tenants}"
        ),
        "`admin.host_secrets`" => format!(
            "state: {{keys: [\"{STATE_KEY}\"]}}\nadmin: {{listen: \"127.0.0.1:0\", host_secrets: {{{flow}}}}}\n{tenants}"
        ),
        "`tenant_store`" => {
            format!("state: {{keys: [\"{STATE_KEY}\"]}}\ntenant_store: {{{flow}}}\n{tenants}")
        }
        "`oauth` (the consent listener)" => format!(
            "oauth: {{listen: \"127.0.0.1:0\", public_url: \"https://gw.example\", {flow}}}\n{tenants}"
        ),
        "`servers[].oauth`" => {
            // token_exchange takes every key but `identity_provider` (which
            // goes with identity_assertion); both need JWT callers, the
            // identity provider one of their issuers.
            let grant = if flow.contains("identity_provider") {
                "grant: identity_assertion"
            } else {
                "grant: token_exchange"
            };
            let flow = flow.replace(
                "identity_provider: {",
                "identity_provider: {issuer: \"https://idp.example\", client_id: gw, ",
            );
            format!(
                "state: {{keys: [\"{STATE_KEY}\"]}}\noauth: {{listen: \"127.0.0.1:0\", public_url: \"https://gw.example\"}}\ncallers: {{jwt: [{{issuer: \"https://idp.example\", audiences: [toolgate], tenant: \"'t'\", jwks: {{url: \"https://idp.example/jwks\"}}}}]}}\ntenants: [{{name: t, tokens: [tok], servers: [{{name: s, url: \"https://mcp.example/mcp\", oauth: {{{grant}, client_id: c, client_secret: s3cret, {flow}}}}}]}}]"
            )
        }
        "`guards`" => {
            format!("guards: [{{name: g, url: \"http://127.0.0.1:7000\", {flow}}}]\n{tenants}")
        }
        _ => return None,
    })
}

fn load(yaml: &str) -> Result<Config, String> {
    let env = std::collections::HashMap::<String, String>::new();
    Config::from_yaml(yaml, "test.yaml", Path::new("."), &env).map_err(|e| e.to_string())
}

/// The fields serde names in an unknown-field error: "unknown field `x`,
/// expected one of `a`, `b`" (or "expected `a` or `b`").
fn expected_fields(error: &str) -> Option<BTreeSet<String>> {
    let at = error.find("unknown field `zz_unknown`")?;
    let rest = &error[at..];
    let rest = &rest[rest.find("expected")?..];
    let rest = rest.split(" at line").next().unwrap_or(rest);
    Some(
        rest.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect(),
    )
}

/// The keys the parser accepts where `section` (and, with `nested`, its map
/// `nested`) is.
fn accepted(section: &str, nested: Option<&str>) -> Result<BTreeSet<String>, String> {
    let probe = match nested {
        None => "zz_unknown: 1".to_owned(),
        Some(map) => format!("{map}: {{zz_unknown: 1}}"),
    };
    let yaml = config_with(section, &[probe], false).expect("a known section");
    let error = match load(&yaml) {
        Ok(_) => return Err(format!("{section}: an unknown key was accepted:\n{yaml}")),
        Err(error) => error,
    };
    expected_fields(&error)
        .ok_or_else(|| format!("{section} {nested:?}: not an unknown-field error: {error}\n{yaml}"))
}

/// A default cell that is one literal: `` `"5s"` `` or `` `1048576` (1 MiB) ``.
fn literal_default(cell: &str) -> Option<String> {
    let rest = cell.strip_prefix('`')?;
    let (literal, after) = rest.split_once('`')?;
    let after = after.trim();
    (after.is_empty() || (after.starts_with('(') && after.ends_with(')')))
        .then(|| literal.to_owned())
}

/// `key: value`, nested for a dotted key (`reconnect.max_backoff`).
fn entry(key: &str, value: &str) -> String {
    match key.split_once('.') {
        Some((map, inner)) => format!("{map}: {{{inner}: {value}}}"),
        None => format!("{key}: {value}"),
    }
}

#[test]
fn every_configuration_key_is_documented_and_every_documented_key_is_accepted() {
    let page = std::fs::read_to_string(repo_root().join("docs/configuration.md")).unwrap();
    let tables = key_tables(&page);
    assert!(tables.len() >= 15, "key tables found: {:?}", tables.keys());
    let mut problems = Vec::new();
    for (section, rows) in &tables {
        if config_with(section, &[], false).is_none() {
            problems.push(format!(
                "docs/configuration.md: a key table under `{section}` that this test does not place"
            ));
            continue;
        }
        let documented: BTreeSet<String> = rows
            .iter()
            .flat_map(|r| r.keys.iter())
            .map(|k| k.split('.').next().unwrap().to_owned())
            .collect();
        match accepted(section, None) {
            Err(e) => problems.push(e),
            Ok(accepted) => {
                for key in accepted.difference(&documented) {
                    problems.push(format!("{section}: `{key}` is accepted but not documented"));
                }
                for key in documented.difference(&accepted) {
                    problems.push(format!("{section}: `{key}` is documented but not accepted"));
                }
            }
        }
        // Maps documented key by key (`jwks.url`, `reconnect.max_backoff`).
        let mut nested: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for key in rows.iter().flat_map(|r| r.keys.iter()) {
            if let Some((map, inner)) = key.split_once('.')
                && inner != "*"
            {
                nested
                    .entry(map.to_owned())
                    .or_default()
                    .insert(inner.to_owned());
            }
        }
        for (map, documented) in nested {
            match accepted(section, Some(&map)) {
                Err(e) => problems.push(e),
                Ok(accepted) => {
                    if accepted != documented {
                        problems.push(format!(
                            "{section}: `{map}` accepts {accepted:?}, documented {documented:?}"
                        ));
                    }
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/configuration.md against the parser:\n{}",
        problems.join("\n")
    );
}

/// Defaults the configuration keeps as "not set" on purpose, with how the
/// documented value is checked instead.
fn special_default(section: &str, key: &str, literal: &str) -> Option<Result<(), String>> {
    Some(match (section, key) {
        // Kept unset so that `--log-format` on the command line wins; unset
        // means the default format.
        ("Top level", "log_format") => {
            let default = format!("{:?}", toolgate::config::LogFormat::default()).to_lowercase();
            if default == literal {
                Ok(())
            } else {
                Err(format!("the default format is {default}"))
            }
        }
        // A URL is a secret (it may hold a password): unset means the
        // store's own default.
        ("State store", "url") => {
            if toolgate::state::DEFAULT_URL == literal {
                Ok(())
            } else {
                Err(format!(
                    "the default URL is {}",
                    toolgate::state::DEFAULT_URL
                ))
            }
        }
        // A `tls:` block loads only with real certificate files, which
        // this test has none of: the documented values are the constants.
        ("Listener TLS", key) => {
            let default = match key {
                "client_hello_timeout" => format!(
                    "{}",
                    humantime::format_duration(toolgate::config::DEFAULT_CLIENT_HELLO_TIMEOUT)
                ),
                "handshake_timeout" => format!(
                    "{}",
                    humantime::format_duration(toolgate::config::DEFAULT_HANDSHAKE_TIMEOUT)
                ),
                "max_handshakes" => toolgate::config::DEFAULT_MAX_HANDSHAKES.to_string(),
                "max_handshakes_per_peer" => {
                    toolgate::config::DEFAULT_MAX_HANDSHAKES_PER_PEER.to_string()
                }
                _ => return None,
            };
            if default == literal.trim_matches('"') {
                Ok(())
            } else {
                Err(format!("the default is {default}"))
            }
        }
        _ => return None,
    })
}

/// A default that names another setting (`defaults.call_timeout`,
/// `rate_per_second`) rather than a value.
fn names_a_setting(literal: &str, rows: &[Row]) -> bool {
    literal.starts_with("defaults.") || rows.iter().any(|r| r.keys.iter().any(|k| k == literal))
}

#[test]
fn documented_defaults_are_the_defaults() {
    let page = std::fs::read_to_string(repo_root().join("docs/configuration.md")).unwrap();
    let mut problems = Vec::new();
    let mut checked = 0;
    for (section, rows) in key_tables(&page) {
        for row in &rows {
            let Some(literal) = literal_default(&row.default) else {
                continue;
            };
            if names_a_setting(&literal, &rows) {
                continue;
            }
            let stdio = row.applies == "stdio";
            for key in &row.keys {
                if let Some(checked_here) = special_default(&section, key, &literal) {
                    match checked_here {
                        Ok(()) => checked += 1,
                        Err(e) => problems.push(format!(
                            "{section}: `{key}` is documented to default to {literal}, but {e}"
                        )),
                    }
                    continue;
                }
                let (Some(with), Some(without)) = (
                    config_with(&section, &[entry(key, &literal)], stdio),
                    config_with(&section, &[], stdio),
                ) else {
                    continue;
                };
                let with = load(&with).map(|c| format!("{c:?}"));
                let without = load(&without).map(|c| format!("{c:?}"));
                match (with, without) {
                    (Ok(with), Ok(without)) if with == without => checked += 1,
                    (Ok(_), Ok(_)) => problems.push(format!(
                        "{section}: `{key}: {literal}` (the documented default) loads differently from leaving it out"
                    )),
                    (Err(e), _) => problems.push(format!("{section}: `{key}: {literal}` is refused: {e}")),
                    (_, Err(e)) => problems.push(format!("{section}: the base configuration is refused: {e}")),
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "documented defaults:\n{}",
        problems.join("\n")
    );
    assert!(checked >= 40, "only {checked} defaults were checked");
}

/// The `*.md` pages under docs/.
fn pages() -> Vec<(String, String)> {
    let mut pages: Vec<(String, String)> = std::fs::read_dir(repo_root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| {
            (
                format!("docs/{}", p.file_name().unwrap().to_string_lossy()),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    pages.sort();
    pages
}

/// The ```yaml blocks of a page that are whole configurations (a top-level
/// `tenants:`), with their line.
fn whole_configurations(page: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut block: Option<(usize, String)> = None;
    for (number, line) in page.lines().enumerate() {
        match &mut block {
            None if line.trim() == "```yaml" => block = Some((number + 1, String::new())),
            None => {}
            Some((start, text)) => {
                if line.trim() == "```" {
                    if text.lines().any(|l| l.starts_with("tenants:")) {
                        found.push((*start, std::mem::take(text)));
                    }
                    block = None;
                } else {
                    text.push_str(line);
                    text.push('\n');
                }
            }
        }
    }
    found
}

#[test]
fn whole_configurations_in_the_docs_load() {
    let mut problems = Vec::new();
    let mut loaded = 0;
    let dir = tempfile::tempdir().unwrap();
    for (name, page) in pages() {
        for (line, yaml) in whole_configurations(&page) {
            // An approvals file (it also has a top-level `tenants:`).
            if yaml.lines().any(|l| l.starts_with("version:")) {
                let file = dir.path().join("approvals.yaml");
                std::fs::write(&file, &yaml).unwrap();
                match toolgate::approvals::read(&file) {
                    Ok(Some(_)) => loaded += 1,
                    other => problems.push(format!("{name}:{line}: {other:?}")),
                }
                continue;
            }
            // `servers: [...]` elides a tenant's servers.
            let yaml = yaml.replace("[...]", "[]");
            // Relative files the example reads exist (with a value that is
            // also a valid state key).
            for rest in yaml.split("file:").skip(1) {
                let path: String = rest
                    .trim_start()
                    .trim_start_matches(['"', '\''])
                    .chars()
                    .take_while(|c| !matches!(c, '"' | '\'' | ' ' | '}' | '\n' | ','))
                    .collect();
                if !path.is_empty() && Path::new(&path).is_relative() {
                    let at = dir.path().join(&path);
                    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
                    std::fs::write(at, STATE_KEY).unwrap();
                }
            }
            // Every `{env: VAR}` the example names is set, each to a value
            // of its own (two tokens must differ) that is also a valid
            // state key (32 bytes in base64); files it names are not read.
            let env: std::collections::HashMap<String, String> = yaml
                .split("env:")
                .skip(1)
                .filter_map(|rest| {
                    let var: String = rest
                        .trim_start()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    (!var.is_empty()).then(|| {
                        use base64::Engine as _;
                        use sha2::Digest as _;
                        let value = base64::engine::general_purpose::STANDARD
                            .encode(sha2::Sha256::digest(var.as_bytes()));
                        (var, value)
                    })
                })
                .collect();
            match Config::from_yaml(&yaml, &format!("{name}:{line}"), dir.path(), &env) {
                Ok(_) => loaded += 1,
                Err(e) => problems.push(format!("{name}:{line}: {e}")),
            }
        }
    }
    assert!(
        problems.is_empty(),
        "examples that do not load:\n{}",
        problems.join("\n")
    );
    assert!(loaded >= 5, "only {loaded} examples were loaded");
}

/// `FailedPrecondition` → `FAILED_PRECONDITION`.
fn screaming(code: &str) -> String {
    let mut out = String::new();
    for (i, c) in code.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// The (statuses, reason) rows of docs/errors.md's status table and its
/// JSON-RPC table: every status a row names (`UNKNOWN` (`UNAVAILABLE` if
/// ...)), and its reason.
fn documented_reasons(page: &str) -> Vec<(BTreeSet<String>, String)> {
    documented_reasons_under(
        page,
        &["Status codes and reasons", "Upstream JSON-RPC errors"],
    )
}

/// The (statuses, reason) rows of the tables under these headings.
fn documented_reasons_under(page: &str, headings: &[&str]) -> Vec<(BTreeSet<String>, String)> {
    let mut rows = Vec::new();
    let mut heading = "";
    let mut columns: Option<(usize, usize)> = None;
    for line in page.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            heading = title.trim();
            columns = None;
            continue;
        }
        if !headings.contains(&heading) {
            continue;
        }
        if !line.starts_with('|') {
            columns = None;
            continue;
        }
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        match columns {
            None => {
                let status = cells.iter().position(|c| *c == "status");
                let reason = cells.iter().position(|c| *c == "reason");
                if let (Some(status), Some(reason)) = (status, reason) {
                    columns = Some((status, reason));
                }
            }
            Some(_) if cells[0].starts_with("---") => {}
            Some((status, reason)) => {
                let (Some(status), Some(reason)) = (cells.get(status), cells.get(reason)) else {
                    continue;
                };
                let ticked = |cell: &str| -> Vec<String> {
                    cell.split('`')
                        .skip(1)
                        .step_by(2)
                        .map(str::to_owned)
                        .collect()
                };
                let statuses: BTreeSet<String> = ticked(status)
                    .into_iter()
                    .filter(|s| s.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
                    .collect();
                // `UPSTREAM_*` stands for the rows of the JSON-RPC table.
                for reason in ticked(reason).into_iter().filter(|r| !r.contains('*')) {
                    rows.push((statuses.clone(), reason));
                }
            }
        }
    }
    rows
}

#[test]
fn the_documented_reasons_are_the_status_tables() {
    let page = std::fs::read_to_string(repo_root().join("docs/errors.md")).unwrap();
    let documented = documented_reasons(&page);
    assert!(documented.len() >= 40, "{documented:?}");
    // The codes and reasons are classified in src/calls/classify.rs; the
    // status table adds the reasons of its details (src/grpc/status.rs).
    let (mut reasons, pairs) = answered(&repo_root().join("src/calls/classify.rs"));
    let (status_reasons, _) = answered(&repo_root().join("src/grpc/status.rs"));
    reasons.extend(status_reasons);
    assert!(pairs.len() >= 40, "{pairs:?}");
    let problems = compare(&documented, &reasons, &pairs, "src/calls/classify.rs");
    assert!(
        problems.is_empty(),
        "docs/errors.md against the status table:\n{}",
        problems.join("\n")
    );
}

/// docs/errors.md's admin API table is src/admin/status.rs's.
#[test]
fn the_documented_admin_reasons_are_the_admin_status_table() {
    let page = std::fs::read_to_string(repo_root().join("docs/errors.md")).unwrap();
    let documented = documented_reasons_under(&page, &["Admin API"]);
    assert!(documented.len() >= 15, "{documented:?}");
    let (reasons, pairs) = answered(&repo_root().join("src/admin/status.rs"));
    assert!(pairs.len() >= 15, "{pairs:?}");
    let problems = compare(&documented, &reasons, &pairs, "src/admin/status.rs");
    assert!(
        problems.is_empty(),
        "docs/errors.md's admin table against src/admin/status.rs:\n{}",
        problems.join("\n")
    );
}

/// A status table of the code: every reason it answers, and the code it
/// pairs each with where the pair is written out.
fn answered(path: &std::path::Path) -> (BTreeSet<String>, BTreeSet<(String, String)>) {
    let source = std::fs::read_to_string(path).unwrap();
    let code: String = source
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    // Not the unit tests' strings.
    let code = code.split("#[cfg(test)]").next().unwrap_or("").to_owned();
    let reasons: BTreeSet<String> = code
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| s.len() > 3 && s.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .map(str::to_owned)
        .collect();
    let mut pairs = BTreeSet::new();
    for (at, _) in code.match_indices("Code::") {
        let rest = &code[at + "Code::".len()..];
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric()).collect();
        let after = rest[name.len()..].trim_start();
        if let Some(after) = after.strip_prefix(',')
            && let Some(literal) = after.trim_start().strip_prefix('"')
        {
            let reason: String = literal.chars().take_while(|c| *c != '"').collect();
            pairs.insert((screaming(&name), reason));
        }
    }
    (reasons, pairs)
}

/// What differs between documented rows and a status table.
fn compare(
    documented: &[(BTreeSet<String>, String)],
    reasons: &BTreeSet<String>,
    pairs: &BTreeSet<(String, String)>,
    source: &str,
) -> Vec<String> {
    let documented_names: BTreeSet<&str> = documented.iter().map(|(_, r)| r.as_str()).collect();
    let mut problems = Vec::new();
    for reason in reasons {
        if !documented_names.contains(reason.as_str()) {
            problems.push(format!(
                "`{reason}` is answered but not in docs/errors.md's tables"
            ));
        }
    }
    for reason in &documented_names {
        if !reasons.contains(*reason) {
            problems.push(format!(
                "`{reason}` is documented but {source} never answers it"
            ));
        }
    }
    for (status, reason) in pairs {
        let listed = documented
            .iter()
            .any(|(statuses, r)| r == reason && statuses.contains(status));
        if !listed {
            problems.push(format!(
                "`{reason}` is answered with `{status}`, which docs/errors.md does not give it"
            ));
        }
    }
    problems
}

/// A setting a page names with its default (`` `name` (default 2) ``) is a
/// key of docs/configuration.md's tables: a constant must not read like
/// one.
#[test]
fn what_reads_like_a_setting_is_one() {
    let configuration = std::fs::read_to_string(repo_root().join("docs/configuration.md")).unwrap();
    let keys: BTreeSet<String> = key_tables(&configuration)
        .values()
        .flatten()
        .flat_map(|r| r.keys.iter())
        .flat_map(|k| k.split('.').map(str::to_owned).collect::<Vec<_>>())
        .collect();
    let mut problems = Vec::new();
    for (name, page) in pages() {
        for (at, _) in page.match_indices("` (default ") {
            let Some(open) = page[..at].rfind('`') else {
                continue;
            };
            let named = &page[open + 1..at];
            if named
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.')
                && !named.split('.').all(|part| keys.contains(part))
            {
                let line = page[..at].matches('\n').count() + 1;
                problems.push(format!(
                    "{name}:{line}: `{named}` reads like a setting and is none"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every `src/…`, `tests/…` or `examples/…` path the pages and the README
/// name is there.
#[test]
fn the_files_the_docs_name_exist() {
    let root = repo_root();
    let mut texts = pages();
    texts.push((
        "README.md".to_owned(),
        std::fs::read_to_string(root.join("README.md")).unwrap(),
    ));
    let mut problems = Vec::new();
    let mut seen = 0;
    for (name, text) in texts {
        for piece in text.split('`').skip(1).step_by(2) {
            let path = piece.trim_end_matches(['/', ':']);
            let named = ["src/", "tests/", "examples/"]
                .iter()
                .any(|p| path.starts_with(p));
            if !named || path.contains(['*', ' ', '<', '{']) {
                continue;
            }
            seen += 1;
            if !root.join(path).exists() {
                problems.push(format!("{name}: `{piece}` does not exist"));
            }
        }
    }
    assert!(seen >= 20, "only {seen} paths named");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
