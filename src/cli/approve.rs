//! `toolgate approve`: connect, list, and record the current definition
//! hash of every exposed tool in the approvals file, for review in its diff.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::approvals::{self, Approval, Approvals, ServerApprovals};
use crate::catalog::{Catalog, ServerState, ServerStatus};
use crate::config::Config;
use crate::registry::Registry;

/// Arguments of `toolgate approve`.
#[derive(Debug, clap::Args)]
pub(super) struct ApproveArgs {
    /// The YAML configuration file (its `approvals.file` is written).
    #[arg(long, short)]
    config: PathBuf,
    /// Approve this tenant's servers only (the other entries are kept).
    #[arg(long)]
    tenant: Option<String>,
    /// Approve this server only (of every tenant in scope that has it; a
    /// server with `definitions: any` may be named to approve it ahead of
    /// switching it to `approved`). The other entries are kept.
    #[arg(long)]
    server: Option<String>,
}

/// Runs `toolgate approve`: exit 0 when every server in scope was listed
/// and recorded, 1 when one could not be (its previous approvals are kept),
/// 64 for an invalid configuration or scope.
pub(super) async fn run(args: ApproveArgs) -> ExitCode {
    let mut config = match super::load(&args.config) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let file = match check_scope(&config, &args) {
        Ok(file) => file,
        Err(message) => {
            eprintln!("toolgate: {}: {message}", args.config.display());
            return ExitCode::from(super::EXIT_CONFIG);
        }
    };
    let previous = match approvals::read(&file) {
        Ok(Some((approvals, _))) => Some(approvals),
        Ok(None) => None,
        Err(e) => {
            eprintln!("toolgate: {e}; fix or remove it before approving again");
            return ExitCode::FAILURE;
        }
    };
    let configured: BTreeSet<(String, String)> = servers_of(&config).collect();
    narrow_to_scope(&mut config, &args);
    if servers_of(&config).next().is_none() {
        println!(
            "nothing to approve: no server in scope has `definitions: approved` \
             (name one with --server to approve it ahead of time)"
        );
        return ExitCode::SUCCESS;
    }

    // With no approvals: every tool is withheld, and its current hash known.
    let (registry, wait) = match super::connect_every_tenant(
        &config,
        &args.config,
        crate::approvals::Approvals::new(),
    ) {
        Ok(started) => started,
        Err(code) => return code,
    };
    let old = previous.clone().unwrap_or_default();
    let mut new = old.clone();
    let complete = record_current(&registry, wait, &old, &mut new).await;
    registry.shutdown().await;

    if args.tenant.is_none() && args.server.is_none() {
        forget_unconfigured(&mut new, &configured);
    }
    if let Err(code) = write_if_changed(&file, previous.as_ref(), &new) {
        return code;
    }
    if complete {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The approvals file, once `--tenant` and `--server` are known to name
/// what the configuration has; else what is wrong (a usage error).
fn check_scope(config: &Config, args: &ApproveArgs) -> Result<PathBuf, String> {
    let Some(file) = config.approvals.as_ref().map(|a| a.file.clone()) else {
        return Err(
            "`approvals.file` is not set: add `approvals: {file: approvals.yaml}` (relative to \
             the configuration file) and `definitions: approved` to the servers to guard"
                .to_owned(),
        );
    };
    if let Some(tenant) = &args.tenant
        && !config.tenants.iter().any(|t| &t.name == tenant)
    {
        return Err(format!("--tenant: no tenant is named `{tenant}`"));
    }
    if let Some(server) = &args.server
        && !config
            .tenants
            .iter()
            .filter(|t| in_tenant_scope(args, &t.name))
            .any(|t| t.servers.iter().any(|s| &s.name == server))
    {
        return Err(format!(
            "--server: no server is named `{server}`{}",
            args.tenant
                .as_deref()
                .map(|t| format!(" in tenant `{t}`"))
                .unwrap_or_default()
        ));
    }
    Ok(file)
}

/// Whether tenant `name` is in the scope of `--tenant`.
fn in_tenant_scope(args: &ApproveArgs, name: &str) -> bool {
    args.tenant.as_deref().is_none_or(|t| t == name)
}

/// Every (tenant, server) pair the configuration has.
fn servers_of(config: &Config) -> impl Iterator<Item = (String, String)> + '_ {
    config
        .tenants
        .iter()
        .flat_map(|t| t.servers.iter().map(|s| (t.name.clone(), s.name.clone())))
}

/// Keeps only the servers in scope (only they are connected): of the
/// tenants in scope, the one named by `--server`, or else those with
/// `definitions: approved`.
fn narrow_to_scope(config: &mut Config, args: &ApproveArgs) {
    for tenant in &mut config.tenants {
        if !in_tenant_scope(args, &tenant.name) {
            tenant.servers.clear();
            continue;
        }
        tenant.servers.retain(|s| match &args.server {
            Some(server) => &s.name == server,
            None => s.needs_approval(),
        });
    }
    config.tenants.retain(|t| !t.servers.is_empty());
}

/// Records in `new` the current definitions of every connected server,
/// reporting each against `old`; whether every server was connected.
async fn record_current(
    registry: &Registry,
    wait: Duration,
    old: &Approvals,
    new: &mut Approvals,
) -> bool {
    let mut complete = true;
    for tenant in registry.tenants() {
        let catalog = tenant.settled_catalog(wait).await;
        for server in catalog.servers() {
            let label = format!("{}/{}", tenant.name, server.name);
            if server.state != ServerState::Connected {
                complete = false;
                let why = not_connected(&server.state);
                println!("{label}: NOT RECORDED ({why}); its previous approvals are kept");
                continue;
            }
            let current = current_approvals(&catalog, server);
            report(
                &label,
                old.server(&tenant.name, &server.name),
                &current,
                old.has_server(&tenant.name, &server.name),
            );
            new.set_server(&tenant.name, &server.name, current);
            // Prompts alike; a server whose prompts could not be listed
            // keeps its previous prompt approvals.
            if let Some(reason) = &server.prompts_error {
                complete = false;
                println!(
                    "{label}: prompts NOT RECORDED ({reason}); their previous approvals are kept"
                );
                continue;
            }
            let prompts = current_prompt_approvals(&catalog, server);
            let old_prompts = old.server_prompts(&tenant.name, &server.name);
            if !prompts.is_empty() || !old_prompts.is_empty() {
                report_kind(
                    &label,
                    "prompt",
                    old_prompts,
                    &prompts,
                    !old_prompts.is_empty() || old.has_server(&tenant.name, &server.name),
                );
            }
            new.set_server_prompts(&tenant.name, &server.name, prompts);
            // Skills alike; a server whose listing failed keeps its
            // previous skill approvals (skills left out for sharing a name
            // are not recorded: they are not served either way).
            if let Some(reason) = server
                .skills_error
                .as_ref()
                .filter(|_| server.skill_count == 0 && server.withheld_skills.is_empty())
            {
                complete = false;
                println!(
                    "{label}: skills NOT RECORDED ({reason}); their previous approvals are kept"
                );
                continue;
            }
            let skills = current_skill_approvals(&catalog, server);
            let old_skills = old.server_skills(&tenant.name, &server.name);
            if !skills.is_empty() || !old_skills.is_empty() {
                report_kind(
                    &label,
                    "skill",
                    old_skills,
                    &skills,
                    !old_skills.is_empty() || old.has_server(&tenant.name, &server.name),
                );
            }
            new.set_server_skills(&tenant.name, &server.name, skills);
        }
    }
    complete
}

/// The approvals of every skill `server` lists now, served or withheld.
fn current_skill_approvals(catalog: &Catalog, server: &ServerStatus) -> ServerApprovals {
    catalog
        .skills()
        .iter()
        .filter(|s| s.server == server.name)
        .chain(server.withheld_skills.iter().map(|w| &w.skill))
        .map(|skill| {
            (
                skill.name.clone(),
                Approval {
                    hash: skill.definition_hash.clone(),
                    description: approvals::excerpt(&skill.description),
                },
            )
        })
        .collect()
}

/// Why a server that is not connected is not recorded.
fn not_connected(state: &ServerState) -> String {
    match state {
        ServerState::Failed(reason)
        | ServerState::Refused(reason)
        | ServerState::AuthorizationRequired(reason) => reason.clone(),
        ServerState::Connecting => "still connecting (timed out)".to_owned(),
        ServerState::Idle | ServerState::Connected => "not connected".to_owned(),
    }
}

/// The current definitions of `server`'s tools (exposed and withheld).
fn current_approvals(catalog: &Catalog, server: &ServerStatus) -> ServerApprovals {
    catalog
        .tools()
        .iter()
        .filter(|t| t.server == server.name)
        .chain(server.withheld.iter().map(|w| &w.tool))
        .map(|tool| {
            (
                tool.name.clone(),
                Approval {
                    hash: tool.definition_hash.clone(),
                    description: approvals::excerpt(&tool.description),
                },
            )
        })
        .collect()
}

/// The current definitions of `server`'s prompts (exposed and withheld).
fn current_prompt_approvals(catalog: &Catalog, server: &ServerStatus) -> ServerApprovals {
    catalog
        .prompts()
        .iter()
        .filter(|p| p.server == server.name)
        .chain(server.withheld_prompts.iter().map(|w| &w.prompt))
        .map(|prompt| {
            (
                prompt.name.clone(),
                Approval {
                    hash: prompt.definition_hash.clone(),
                    description: approvals::excerpt(&prompt.description),
                },
            )
        })
        .collect()
}

/// A full approval forgets servers no longer configured.
fn forget_unconfigured(new: &mut Approvals, configured: &BTreeSet<(String, String)>) {
    let mut gone = Vec::new();
    new.retain(|tenant, server| {
        let keep = configured.contains(&(tenant.to_owned(), server.to_owned()));
        if !keep {
            gone.push(format!("{tenant}/{server}"));
        }
        keep
    });
    for label in gone {
        println!("{label}: no longer configured; its approvals are removed");
    }
}

/// Writes `new` to the approvals file unless it is what the file held.
///
/// # Errors
/// The file cannot be written (said on stderr).
fn write_if_changed(
    file: &std::path::Path,
    previous: Option<&Approvals>,
    new: &Approvals,
) -> Result<(), ExitCode> {
    if previous == Some(new) {
        println!("{}: unchanged", file.display());
        return Ok(());
    }
    if let Err(e) = approvals::write(file, new) {
        eprintln!("toolgate: {e}");
        return Err(ExitCode::FAILURE);
    }
    println!(
        "{}: written ({} tool(s) and {} prompt(s) approved); review the diff and commit it",
        file.display(),
        new.tool_count(),
        new.prompt_count()
    );
    Ok(())
}

/// Prints what approving `current` tools changes for one server.
fn report(label: &str, old: &ServerApprovals, current: &ServerApprovals, known: bool) {
    report_kind(label, "tool", old, current, known);
}

/// Prints what approving `current` definitions of one kind (`tool`,
/// `prompt`) changes for one server.
fn report_kind(
    label: &str,
    kind: &str,
    old: &ServerApprovals,
    current: &ServerApprovals,
    known: bool,
) {
    let added = current.keys().filter(|k| !old.contains_key(*k)).count();
    let removed = old.keys().filter(|k| !current.contains_key(*k)).count();
    let changed = current
        .iter()
        .filter(|(k, a)| old.get(*k).is_some_and(|o| o.hash != a.hash))
        .count();
    println!(
        "{label}: {} {kind}(s){}",
        current.len(),
        if !known {
            " (first approval)".to_owned()
        } else if added + removed + changed == 0 {
            ", unchanged".to_owned()
        } else {
            format!(", {added} added, {changed} changed, {removed} removed")
        }
    );
    for (name, approval) in current {
        match old.get(name) {
            None => println!("  + {name} {}: \"{}\"", approval.hash, approval.description),
            Some(o) if o.hash != approval.hash => println!(
                "  ~ {name} {} → {}: \"{}\"",
                o.hash, approval.hash, approval.description
            ),
            Some(_) => {}
        }
    }
    for name in old.keys().filter(|k| !current.contains_key(*k)) {
        println!("  - {name}");
    }
}
