//! The command line: `serve`, `check` and `demo`, the client verbs
//! `tools` and `call` (in [`client`]), `call-approvals` (the approvers'
//! verbs), `audit verify`, and `state migrate-subjects` (in [`subjects`]).

mod answerer;
mod answers;
mod approve;
mod audit;
mod call_approvals;
mod channel;
mod check_delegation;
mod check_tenants;
mod check_tls;
pub mod client;
#[doc(hidden)]
pub mod conformance;
pub mod demo;
mod follow;
mod health;
mod offerings;
mod prompt;
mod skills;
pub mod subjects;
mod tenants;
mod when;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::catalog::ServerState;
use crate::config::LogFormat;
use crate::config::{Config, ProcessEnv};
use crate::registry::Registry;
use crate::telemetry;

/// Exit code for an invalid configuration (EX_USAGE… EX_DATAERR family:
/// 64 is what operators' tooling expects for "bad input").
pub const EXIT_CONFIG: u8 = 64;

/// How long the runtime waits, once a command is done, for what still runs
/// on it before the process exits anyway.
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(1);

/// toolgate: per-tenant MCP tool catalogs served over gRPC.
#[derive(Debug, Parser)]
#[command(name = "toolgate", version, about)]
pub struct Cli {
    /// Log format on stderr (default: the config's `log_format`, else text).
    #[arg(long, global = true, value_enum)]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        /// The YAML configuration file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate the configuration (and every file of its `tenants_dir`),
    /// connect every server, print each tenant's catalog and each tool
    /// withheld for want of approval (approved hash → current hash); exit
    /// 1 if any server failed or was refused, or a tool is withheld, 64 if
    /// the configuration or a tenant file is invalid. With `--tenant`,
    /// validate those one-tenant files only (offline).
    Check {
        /// The YAML configuration file (with `--tenant`: the configuration
        /// the files are validated against; without it, an empty one).
        #[arg(long, short, required_unless_present = "tenant")]
        config: Option<PathBuf>,
        /// Validate only; do not connect to any server.
        #[arg(long)]
        offline: bool,
        /// One-tenant files (as in `tenants_dir`) to validate offline, each
        /// named by its file name without the extension.
        #[arg(long, value_name = "FILE", num_args = 1..)]
        tenant: Vec<PathBuf>,
    },
    /// Connect the servers with `definitions: approved` and record the
    /// current definition hash of each of their tools in the approvals
    /// file (other entries are kept); review the file's diff, commit it,
    /// and the gateway serves those definitions. Exit 1 if a server in
    /// scope could not be listed (its previous approvals are kept).
    Approve(approve::ApproveArgs),
    /// Run an in-process MCP server, a gateway in front of it, and a gRPC
    /// client against that; print what happens.
    Demo,
    /// List the tools of a running gateway (token: TOOLGATE_TOKEN or --token-file).
    Tools(client::ToolsArgs),
    /// Invoke one tool on a running gateway and print the result.
    Call(client::CallArgs),
    /// List the resources and resource templates of a running gateway.
    Resources(offerings::ResourcesArgs),
    /// Read one resource of a server through a running gateway.
    Read(offerings::ReadArgs),
    /// List the prompts of a running gateway.
    Prompts(offerings::PromptsArgs),
    /// Render one prompt through a running gateway (arguments key=value).
    Prompt(offerings::PromptArgs),
    /// List the skills (SEP-2640) of a running gateway, with their files.
    Skills(skills::SkillsArgs),
    /// Fetch one skill through a running gateway, verified against its
    /// digests (`SKILL.md`; `--files`: every file; `--path P`: these).
    Skill(skills::SkillArgs),
    /// List, show, approve, deny or watch the tool calls a
    /// `require_approval` rule holds for a person's approval (not tool
    /// definitions: that is `approve`).
    CallApprovals {
        #[command(subcommand)]
        command: call_approvals::CallApprovalsCommand,
    },
    /// Ask a running gateway's gRPC health service (an exec probe for a
    /// gateway with `grpc.tls`); exit 0 when SERVING.
    Health(health::HealthArgs),
    /// Manage the tenants of the state store through a running gateway's
    /// admin API (token: TOOLGATE_ADMIN_TOKEN or --token-file).
    Tenants {
        #[command(subcommand)]
        command: tenants::TenantsCommand,
    },
    /// Work with audit files: `verify` checks their hash chain.
    Audit {
        #[command(subcommand)]
        command: audit::AuditCommand,
    },
    /// Maintain the state store (upstream OAuth tokens).
    State {
        #[command(subcommand)]
        command: StateCommand,
    },
    /// Run one scenario of the MCP conformance suite against URL with the
    /// gateway's upstream client (scenario from MCP_CONFORMANCE_SCENARIO).
    #[command(hide = true)]
    ConformanceClient {
        /// The scenario server's URL.
        url: String,
    },
}

#[derive(Debug, Subcommand)]
enum StateCommand {
    /// Move the tokens an earlier release stored under a bare subject id
    /// to the key saying who vouched for the subject (`token:ID` or
    /// `jwt:ISSUER ID`); rows not moved make their subjects consent again.
    MigrateSubjects(subjects::MigrateSubjectsArgs),
}

/// Parses the command line and runs the command.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("toolgate: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async move {
        match cli.command {
            Command::Serve { config } => serve(config, cli.log_format).await,
            Command::Check {
                config,
                offline,
                tenant,
            } => {
                let guard = telemetry::init(cli.log_format.unwrap_or_default(), "warn");
                let code = match config {
                    Some(config) if tenant.is_empty() => check(config, offline).await,
                    config => check_tenants::check_tenant_files(config.as_deref(), &tenant),
                };
                guard.shutdown().await;
                code
            }
            Command::Approve(args) => {
                // What approve finds is printed; logs only for errors.
                let guard = telemetry::init(cli.log_format.unwrap_or_default(), "error");
                let code = approve::run(args).await;
                guard.shutdown().await;
                code
            }
            Command::State {
                command: StateCommand::MigrateSubjects(args),
            } => {
                let guard = telemetry::init(cli.log_format.unwrap_or_default(), "error");
                let code = subjects::run(args).await;
                guard.shutdown().await;
                code
            }
            Command::Tenants { command } => tenants::run(command).await,
            Command::Health(args) => health::run(args).await,
            Command::Audit { command } => audit::run(command),
            Command::Tools(args) => client::tools(args).await,
            Command::Call(args) => client::call(args).await,
            Command::Resources(args) => offerings::resources(args).await,
            Command::Read(args) => offerings::read(args).await,
            Command::Prompts(args) => offerings::prompts(args).await,
            Command::Prompt(args) => offerings::prompt(args).await,
            Command::Skills(args) => skills::skills(args).await,
            Command::Skill(args) => skills::skill(args).await,
            Command::CallApprovals { command } => call_approvals::run(command).await,
            Command::ConformanceClient { url } => {
                let guard = telemetry::init(cli.log_format.unwrap_or_default(), "info,rmcp=warn");
                let code = match crate::cli::conformance::run(&url).await {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("toolgate conformance-client: {e:#}");
                        ExitCode::FAILURE
                    }
                };
                guard.shutdown().await;
                code
            }
            Command::Demo => {
                let guard = telemetry::init(cli.log_format.unwrap_or_default(), "warn");
                let code = match crate::cli::demo::run().await {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("toolgate demo failed: {e:#}");
                        ExitCode::FAILURE
                    }
                };
                guard.shutdown().await;
                code
            }
        }
    });
    // Work still running on the runtime's blocking threads (a file read
    // stuck in a hung mount, a task that never ends) does not keep the
    // process alive once the command is done: it is left behind.
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
    code
}

fn load(path: &std::path::Path) -> Result<Config, ExitCode> {
    Config::load(path, &ProcessEnv).map_err(|e| {
        eprintln!("toolgate: {e}");
        ExitCode::from(EXIT_CONFIG)
    })
}

async fn serve(path: PathBuf, log_format: Option<LogFormat>) -> ExitCode {
    let config = match load(&path) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let format = log_format.or(config.log_format).unwrap_or_default();
    let guard = telemetry::init(format, "info,rmcp=warn");
    let shutdown = match crate::app::Shutdown::on_signals() {
        Ok(shutdown) => shutdown,
        Err(e) => {
            eprintln!("toolgate: cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let env: Arc<dyn crate::config::Environment> = Arc::new(ProcessEnv);
    let source = crate::registry::reload::ConfigSource {
        path: path.clone(),
        env: env.clone(),
    };
    let result = crate::app::serve(config, env, shutdown, Some(source)).await;
    guard.shutdown().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "toolgate failed");
            eprintln!("toolgate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Starts a registry for `config` (with its state store when a server
/// uses OAuth) and connects every tenant, lazy ones included, for `check`
/// and `approve`. Returns it with how long to wait for catalogs to settle
/// (the longest `connect_timeout`, plus a second).
///
/// # Errors
/// The state store cannot be opened: the error is printed, and the exit
/// code returned.
pub(crate) fn connect_every_tenant(
    config: &Config,
    path: &std::path::Path,
    approvals: crate::approvals::Approvals,
) -> Result<(Arc<Registry>, Duration), ExitCode> {
    let oauth = crate::app::open_oauth(config).map_err(|e| {
        eprintln!("{}: {e}", path.display());
        ExitCode::FAILURE
    })?;
    let registry = Registry::start_with_approvals(
        config,
        Arc::new(ProcessEnv),
        Arc::new(crate::telemetry::Metrics::new()),
        oauth,
        approvals,
    );
    let wait = config
        .tenants
        .iter()
        .flat_map(|t| &t.servers)
        .map(|s| s.connect_timeout)
        .max()
        .unwrap_or_default()
        + Duration::from_secs(1);
    for tenant in registry.tenants() {
        tenant.activate();
    }
    Ok((registry, wait))
}

/// The approvals `check` lists against: the configured file's (a line
/// saying how many tools it approves), or none when it does not exist yet
/// (a warning).
///
/// # Errors
/// The file exists but cannot be read or is malformed (exit 1).
fn check_approvals(config: &Config) -> Result<crate::approvals::Approvals, ExitCode> {
    let Some(file) = config.approvals.as_ref().map(|a| &a.file) else {
        return Ok(crate::approvals::Approvals::new());
    };
    match crate::approvals::read(file) {
        Ok(Some((approvals, _))) => {
            println!(
                "approvals: {} ({} tool(s) and {} prompt(s) approved{})",
                file.display(),
                approvals.tool_count(),
                approvals.prompt_count(),
                match approvals.skill_count() {
                    0 => String::new(),
                    n => format!(", {n} skill(s)"),
                }
            );
            Ok(approvals)
        }
        Ok(None) => {
            println!(
                "warning: the approvals file {} does not exist: nothing is approved yet, so \
                 every tool of a `definitions: approved` server is withheld (run `toolgate approve`)",
                file.display()
            );
            Ok(crate::approvals::Approvals::new())
        }
        Err(e) => {
            eprintln!("toolgate: {e}");
            Err(ExitCode::FAILURE)
        }
    }
}

/// A line about the audit trail, when one is configured: where records
/// go, what they keep of the arguments, and whether the arguments' digest
/// has a configured key (named by its id, never shown).
fn check_audit(config: &Config) {
    use crate::config::{AuditArguments, AuditDestination};
    let Some(audit) = &config.audit else {
        return;
    };
    let destination = match &audit.destination {
        AuditDestination::Stdout => "standard output".to_owned(),
        AuditDestination::File(path) => path.display().to_string(),
    };
    let arguments = match audit.arguments {
        AuditArguments::Digest => "digest",
        AuditArguments::None => "none",
        AuditArguments::Full => "full",
    };
    let key = match &audit.digest_key {
        Some(key) => format!(
            "digest key configured (key_id {})",
            crate::audit::DigestKey::new(Some(key)).id()
        ),
        None => "no digest key: a random key per process".to_owned(),
    };
    println!(
        "audit: {destination}, arguments {arguments}, {key}{}",
        if audit.required { ", required" } else { "" }
    );
    if audit.digest_key.is_none() && audit.arguments == AuditArguments::Digest {
        println!(
            "warning: audit.digest_key is not set: argument digests cannot be compared across \
             restarts or replicas"
        );
    }
}

async fn check(path: PathBuf, offline: bool) -> ExitCode {
    let config = match load(&path) {
        Ok(config) => config,
        Err(code) => return code,
    };
    println!(
        "{}: configuration is valid ({} tenant(s))",
        path.display(),
        config.tenants.len()
    );
    for warning in config.warnings() {
        println!("warning: {warning}");
    }
    let config = match check_tenants::check_tenants_dir(config) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let approvals = match check_approvals(&config) {
        Ok(approvals) => approvals,
        Err(code) => return code,
    };
    check_audit(&config);
    check_tenants::print_call_time_rules(&config);
    check_tls::check_listener_tls(&config);
    check_tls::check_cert_callers(&config);
    check_delegation::check_delegated_servers(&config);
    if offline {
        return ExitCode::SUCCESS;
    }
    let (registry, wait) = match connect_every_tenant(&config, &path, approvals) {
        Ok(started) => started,
        Err(code) => return code,
    };
    let mut healthy = true;
    let jwt_issuers: Vec<String> = config
        .callers
        .jwt
        .iter()
        .map(|j| j.issuer.clone())
        .collect();
    for tenant in registry.tenants() {
        let catalog = tenant.settled_catalog(wait).await;
        println!(
            "\ntenant {}  (catalog_version {})",
            tenant.name,
            catalog.version()
        );
        for server in catalog.servers() {
            let state = match &server.state {
                ServerState::Connected => format!("connected, {} tool(s)", server.tool_count),
                ServerState::Idle => "idle (lazy tenant, not connected)".to_owned(),
                ServerState::Connecting => {
                    healthy = false;
                    "still connecting (timed out)".to_owned()
                }
                ServerState::Failed(reason) => {
                    healthy = false;
                    format!("FAILED: {reason}")
                }
                ServerState::Refused(reason) => {
                    healthy = false;
                    format!("REFUSED: {reason}")
                }
                // Not a fault: the server waits for an end user's consent.
                ServerState::AuthorizationRequired(reason) => {
                    format!("waiting for authorization: {reason}")
                }
            };
            println!("  server {} ({}): {state}", server.name, server.transport);
            if let Some(client) = tenant.oauth_client(&server.name) {
                let description = client.describe().await;
                let issuer = match &description.issuer {
                    Ok(issuer) => issuer.clone(),
                    Err(e) => {
                        healthy = false;
                        format!("DISCOVERY FAILED: {e}")
                    }
                };
                println!(
                    "    oauth: grant {}, client {}, issuer {issuer}",
                    description.grant, description.identity
                );
                if client.is_delegated() {
                    match client.describe_delegation(&jwt_issuers).await {
                        Ok(line) => println!("    delegation: {line}"),
                        Err(e) => {
                            healthy = false;
                            println!("    delegation: DISCOVERY FAILED: {e}");
                        }
                    }
                }
            }
            for tool in catalog.tools().iter().filter(|t| t.server == server.name) {
                println!("    {}", tool.name);
            }
            // The approval diff: approved hash → current hash.
            for withheld in &server.withheld {
                healthy = false;
                println!(
                    "    WITHHELD {}: {} → {}: \"{}\"",
                    withheld.tool.name,
                    withheld
                        .approved_hash
                        .as_deref()
                        .unwrap_or("(not approved)"),
                    withheld.tool.definition_hash,
                    crate::approvals::excerpt(&withheld.tool.description)
                );
            }
            // Prompts alike: listed, withheld, or refused (their tools stay).
            for prompt in catalog.prompts().iter().filter(|p| p.server == server.name) {
                println!("    prompt {}", prompt.name);
            }
            for withheld in &server.withheld_prompts {
                healthy = false;
                println!(
                    "    WITHHELD prompt {}: {} → {}: \"{}\"",
                    withheld.prompt.name,
                    withheld
                        .approved_hash
                        .as_deref()
                        .unwrap_or("(not approved)"),
                    withheld.prompt.definition_hash,
                    crate::approvals::excerpt(&withheld.prompt.description)
                );
            }
            if let Some(reason) = &server.prompts_error {
                healthy = false;
                println!("    PROMPTS REFUSED: {reason}");
            }
            // Skills alike.
            for skill in catalog.skills().iter().filter(|s| s.server == server.name) {
                println!("    skill {}", skill.name);
            }
            for withheld in &server.withheld_skills {
                healthy = false;
                println!(
                    "    WITHHELD skill {}: {} → {}: \"{}\"",
                    withheld.skill.name,
                    withheld
                        .approved_hash
                        .as_deref()
                        .unwrap_or("(not approved)"),
                    withheld.skill.definition_hash,
                    crate::approvals::excerpt(&withheld.skill.description)
                );
            }
            if let Some(reason) = &server.skills_error {
                healthy = false;
                println!("    SKILLS REFUSED: {reason}");
            }
        }
        let mut warnings = crate::catalog::lint::lint(&catalog);
        // Overrides that match no tool are likely typos.
        for (index, server) in tenant.servers().enumerate() {
            let connected = catalog
                .servers()
                .get(index)
                .is_some_and(|s| s.state == ServerState::Connected);
            for tool in server.overrides.keys() {
                if connected
                    && !catalog
                        .tools()
                        .iter()
                        .any(|t| t.server == server.name && &t.upstream_name == tool)
                {
                    warnings.push(crate::catalog::lint::Warning {
                        server: server.name.clone(),
                        tool: tool.clone(),
                        message: "has an override but the server exposes no such tool".to_owned(),
                    });
                }
            }
        }
        for warning in &warnings {
            println!("  warning: {warning}");
        }
    }
    // The keys of each JWT issuer (callers.jwt), fetched or read now.
    for (issuer, keys) in registry.jwt_callers().probe().await {
        match keys {
            Ok(count) => println!("\ncallers.jwt issuer {issuer}: {count} key(s)"),
            Err(reason) => {
                healthy = false;
                println!("\ncallers.jwt issuer {issuer}: JWKS FAILED: {reason}");
            }
        }
    }
    registry.shutdown().await;
    if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
