//! `toolgate approve`: connect, list, and record the current definition
//! hash of every exposed tool in the approvals file, for review in its diff.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::approvals::{self, Approval, ServerApprovals};
use crate::catalog::ServerState;

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
    let usage = |message: String| {
        eprintln!("toolgate: {}: {message}", args.config.display());
        ExitCode::from(super::EXIT_CONFIG)
    };
    let Some(file) = config.approvals.as_ref().map(|a| a.file.clone()) else {
        return usage(
            "`approvals.file` is not set: add `approvals: {file: approvals.yaml}` (relative to \
             the configuration file) and `definitions: approved` to the servers to guard"
                .to_owned(),
        );
    };
    if let Some(tenant) = &args.tenant
        && !config.tenants.iter().any(|t| &t.name == tenant)
    {
        return usage(format!("--tenant: no tenant is named `{tenant}`"));
    }
    let in_tenant_scope = |name: &str| args.tenant.as_deref().is_none_or(|t| t == name);
    if let Some(server) = &args.server
        && !config
            .tenants
            .iter()
            .filter(|t| in_tenant_scope(&t.name))
            .any(|t| t.servers.iter().any(|s| &s.name == server))
    {
        return usage(format!(
            "--server: no server is named `{server}`{}",
            args.tenant
                .as_deref()
                .map(|t| format!(" in tenant `{t}`"))
                .unwrap_or_default()
        ));
    }
    let previous = match approvals::read(&file) {
        Ok(Some((approvals, _))) => Some(approvals),
        Ok(None) => None,
        Err(e) => {
            eprintln!("toolgate: {e}; fix or remove it before approving again");
            return ExitCode::FAILURE;
        }
    };
    let configured: BTreeSet<(String, String)> = config
        .tenants
        .iter()
        .flat_map(|t| t.servers.iter().map(|s| (t.name.clone(), s.name.clone())))
        .collect();

    // Only the servers in scope are connected.
    for tenant in &mut config.tenants {
        if !in_tenant_scope(&tenant.name) {
            tenant.servers.clear();
            continue;
        }
        tenant.servers.retain(|s| match &args.server {
            Some(server) => &s.name == server,
            None => s.needs_approval(),
        });
    }
    config.tenants.retain(|t| !t.servers.is_empty());
    let scope: Vec<(String, String)> = config
        .tenants
        .iter()
        .flat_map(|t| t.servers.iter().map(|s| (t.name.clone(), s.name.clone())))
        .collect();
    if scope.is_empty() {
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
    let mut complete = true;
    for tenant in registry.tenants() {
        let catalog = tenant.settled_catalog(wait).await;
        for server in catalog.servers() {
            let label = format!("{}/{}", tenant.name, server.name);
            if server.state != ServerState::Connected {
                complete = false;
                let why = match &server.state {
                    ServerState::Failed(reason)
                    | ServerState::Refused(reason)
                    | ServerState::AuthorizationRequired(reason) => reason.clone(),
                    ServerState::Connecting => "still connecting (timed out)".to_owned(),
                    ServerState::Idle | ServerState::Connected => "not connected".to_owned(),
                };
                println!("{label}: NOT RECORDED ({why}); its previous approvals are kept");
                continue;
            }
            let current: ServerApprovals = catalog
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
                .collect();
            report(
                &label,
                old.server(&tenant.name, &server.name),
                &current,
                old.has_server(&tenant.name, &server.name),
            );
            new.set_server(&tenant.name, &server.name, current);
        }
    }
    registry.shutdown().await;

    if args.tenant.is_none() && args.server.is_none() {
        // A full approval forgets servers no longer configured.
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

    if previous.as_ref() == Some(&new) {
        println!("{}: unchanged", file.display());
    } else {
        if let Err(e) = approvals::write(&file, &new) {
            eprintln!("toolgate: {e}");
            return ExitCode::FAILURE;
        }
        println!(
            "{}: written ({} tool(s) approved); review the diff and commit it",
            file.display(),
            new.tool_count()
        );
    }
    if complete {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Prints what approving `current` changes for one server.
fn report(label: &str, old: &ServerApprovals, current: &ServerApprovals, known: bool) {
    let added = current.keys().filter(|k| !old.contains_key(*k)).count();
    let removed = old.keys().filter(|k| !current.contains_key(*k)).count();
    let changed = current
        .iter()
        .filter(|(k, a)| old.get(*k).is_some_and(|o| o.hash != a.hash))
        .count();
    println!(
        "{label}: {} tool(s){}",
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
