//! `toolgate tenants ...`: the admin API from the command line, for
//! operators. `apply -f FILE` creates or updates every tenant in a file
//! (one tenant, a `tenants:` list, or several YAML documents), `get`,
//! `delete`, `list`, and `secrets put|list|delete` (a secret's value read
//! from standard input, never from a flag that would land in shell
//! history). The admin token comes from `TOOLGATE_ADMIN_TOKEN` or
//! `--token-file`. Exit codes follow the gRPC status, as for the other
//! client verbs.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use tonic::transport::Channel;

use crate::pb::admin as pb;
use crate::pb::admin::admin_client::AdminClient;

use super::client::{EXIT_USAGE, fail, usage};

/// The deadline of each admin RPC when `--timeout` is not given.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Most tenants `apply` takes from one file.
const MAX_APPLY: usize = 10_000;

/// Where the admin API is and who the caller is.
#[derive(Debug, Args)]
pub(super) struct AdminConnection {
    /// The admin API's address (`admin.listen`).
    #[arg(
        long,
        default_value = "http://127.0.0.1:50052",
        env = "TOOLGATE_ADMIN_ADDR"
    )]
    addr: String,
    /// TLS to the admin API (`admin.tls`).
    #[command(flatten)]
    tls: super::channel::ClientTls,
    /// A file holding the admin bearer token (one trailing newline is
    /// trimmed). Without it, the token is read from TOOLGATE_ADMIN_TOKEN.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Deadline of each RPC.
    #[arg(long, value_parser = humantime::parse_duration)]
    timeout: Option<Duration>,
    /// Print machine-readable JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// `toolgate tenants` subcommands.
#[derive(Debug, Subcommand)]
pub(super) enum TenantsCommand {
    /// Create or update every tenant in FILE: one tenant (its `name:`, or
    /// --name), a file with a `tenants:` list, or several YAML documents.
    /// A tenant whose stored spec is the same text is left alone.
    Apply(ApplyArgs),
    /// Print one tenant's stored spec and version.
    Get(NameArgs),
    /// Delete a tenant (its token index and secrets too).
    Delete(DeleteArgs),
    /// List the tenants of the state store.
    List(ListArgs),
    /// A tenant's stored secrets (`{stored: NAME}` in its spec).
    Secrets {
        #[command(subcommand)]
        command: SecretsCommand,
    },
}

/// `toolgate tenants secrets` subcommands.
#[derive(Debug, Subcommand)]
pub(super) enum SecretsCommand {
    /// Store a secret of TENANT; the value is read from standard input
    /// (one trailing newline trimmed).
    Put(SecretArgs),
    /// List the names of a tenant's secrets (never their values).
    List(SecretsListArgs),
    /// Delete a secret of a tenant.
    Delete(SecretArgs),
}

/// `toolgate tenants apply` options.
#[derive(Debug, Args)]
pub(super) struct ApplyArgs {
    #[command(flatten)]
    connection: AdminConnection,
    /// The file (`-` for standard input).
    #[arg(short = 'f', long = "file")]
    file: PathBuf,
    /// The tenant's name, for a one-tenant file without `name:`.
    #[arg(long)]
    name: Option<String>,
    /// Replace only this stored version (one tenant only); without it,
    /// the version read just before the write.
    #[arg(long)]
    expected_version: Option<String>,
}

/// Options of a verb on one tenant.
#[derive(Debug, Args)]
pub(super) struct NameArgs {
    #[command(flatten)]
    connection: AdminConnection,
    /// The tenant's name.
    name: String,
}

/// `toolgate tenants delete` options.
#[derive(Debug, Args)]
pub(super) struct DeleteArgs {
    #[command(flatten)]
    connection: AdminConnection,
    /// The tenant's name.
    name: String,
    /// Delete only this stored version.
    #[arg(long)]
    expected_version: Option<String>,
}

/// `toolgate tenants list` options.
#[derive(Debug, Args)]
pub(super) struct ListArgs {
    #[command(flatten)]
    connection: AdminConnection,
}

/// Options of a verb on one secret.
#[derive(Debug, Args)]
pub(super) struct SecretArgs {
    #[command(flatten)]
    connection: AdminConnection,
    /// The tenant the secret belongs to.
    tenant: String,
    /// The secret's name (`{stored: NAME}`).
    name: String,
}

/// `toolgate tenants secrets list` options.
#[derive(Debug, Args)]
pub(super) struct SecretsListArgs {
    #[command(flatten)]
    connection: AdminConnection,
    /// The tenant.
    tenant: String,
}

/// Runs a `toolgate tenants` subcommand.
pub(super) async fn run(command: TenantsCommand) -> ExitCode {
    let result = match command {
        TenantsCommand::Apply(args) => apply(args).await,
        TenantsCommand::Get(args) => get(args).await,
        TenantsCommand::Delete(args) => delete(args).await,
        TenantsCommand::List(args) => list(args).await,
        TenantsCommand::Secrets { command } => match command {
            SecretsCommand::Put(args) => secret_put(args).await,
            SecretsCommand::List(args) => secret_list(args).await,
            SecretsCommand::Delete(args) => secret_delete(args).await,
        },
    };
    result.unwrap_or_else(|code| code)
}

/// A connected admin client with the caller's token and deadline.
struct Admin {
    client: AdminClient<Channel>,
    token: tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
    timeout: Duration,
    json: bool,
}

impl Admin {
    async fn connect(c: &AdminConnection) -> Result<Admin, ExitCode> {
        let token = admin_token(c).map_err(|e| usage(&e))?;
        let token = format!("Bearer {token}")
            .parse()
            .map_err(|_| usage("the admin token is not valid in an HTTP header"))?;
        let channel = super::channel::open(&c.addr, &c.tls, "the admin API")
            .await
            .map_err(|e| match e {
                super::channel::ChannelError::Usage(message) => usage(&message),
                super::channel::ChannelError::Unavailable(message) => {
                    fail(&tonic::Status::unavailable(message), c.json)
                }
            })?;
        Ok(Admin {
            client: AdminClient::new(channel),
            token,
            timeout: c.timeout.unwrap_or(DEFAULT_TIMEOUT),
            json: c.json,
        })
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.timeout);
        request
            .metadata_mut()
            .insert("authorization", self.token.clone());
        request
    }

    fn fail(&self, status: &tonic::Status) -> ExitCode {
        fail(status, self.json)
    }
}

fn admin_token(c: &AdminConnection) -> Result<String, String> {
    super::client::token_from(c.token_file.as_deref(), "TOOLGATE_ADMIN_TOKEN")
}

/// One tenant of a file to apply: its name and its spec's text.
#[derive(Debug, PartialEq, Eq)]
struct Item {
    name: String,
    spec: String,
}

/// The tenants of `text`: one tenant document (sent as written, comments
/// kept), a document with a `tenants:` list, or several documents (each
/// entry sent re-serialized).
fn items(text: &str, name: Option<&str>) -> Result<Vec<Item>, String> {
    let mut documents = Vec::new();
    for document in yaml_serde::Deserializer::from_str(text) {
        let value = <yaml_serde::Value as serde::Deserialize>::deserialize(document)
            .map_err(|e| format!("not YAML: {e}"))?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    let single = documents.len() == 1;
    let mut items = Vec::new();
    for (d, document) in documents.into_iter().enumerate() {
        let entries = match document.get("tenants") {
            Some(yaml_serde::Value::Sequence(list)) => list.clone(),
            Some(_) => return Err(format!("document {}: `tenants` is not a list", d + 1)),
            None => vec![document],
        };
        let listed = entries.len() > 1 || !single;
        for (i, entry) in entries.into_iter().enumerate() {
            let written = entry
                .get("name")
                .and_then(|v| v.as_str())
                .map(str::to_owned);
            let tenant = match (written, name) {
                (Some(written), _) => written,
                (None, Some(name)) if single && !listed => name.to_owned(),
                (None, _) => {
                    return Err(format!(
                        "document {}, tenant {}: no `name:` (give --name for a one-tenant file)",
                        d + 1,
                        i + 1
                    ));
                }
            };
            let spec =
                if single && !listed && entry.get("tenants").is_none() && document_is_entry(text) {
                    text.to_owned()
                } else {
                    yaml_serde::to_string(&entry)
                        .map_err(|e| format!("cannot write the spec: {e}"))?
                };
            items.push(Item { name: tenant, spec });
        }
    }
    if items.is_empty() {
        return Err("the file holds no tenant".to_owned());
    }
    if items.len() > MAX_APPLY {
        return Err(format!(
            "the file holds {} tenants; at most {MAX_APPLY}",
            items.len()
        ));
    }
    Ok(items)
}

/// Whether `text` is one tenant document itself (not a `tenants:` list),
/// so it is sent as written.
fn document_is_entry(text: &str) -> bool {
    yaml_serde::from_str::<yaml_serde::Value>(text)
        .map(|v| v.get("tenants").is_none())
        .unwrap_or(false)
}

async fn apply(args: ApplyArgs) -> Result<ExitCode, ExitCode> {
    let text = if args.file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| usage(&format!("cannot read standard input: {e}")))?;
        text
    } else {
        std::fs::read_to_string(&args.file)
            .map_err(|e| usage(&format!("cannot read {}: {e}", args.file.display())))?
    };
    let items = items(&text, args.name.as_deref())
        .map_err(|e| usage(&format!("{}: {e}", args.file.display())))?;
    if args.expected_version.is_some() && items.len() != 1 {
        return Err(usage("--expected-version applies to a file of one tenant"));
    }
    let mut admin = Admin::connect(&args.connection).await?;
    let mut failed = None;
    for item in items {
        match apply_one(&mut admin, &item, args.expected_version.as_deref()).await {
            Ok((outcome, version)) => {
                if admin.json {
                    println!(
                        "{}",
                        serde_json::json!({"tenant": item.name, "outcome": outcome, "version": version})
                    );
                } else {
                    println!("tenant {} {outcome} (version {version})", item.name);
                }
            }
            Err(status) => {
                eprint!("tenant {}: ", item.name);
                failed = Some(admin.fail(&status));
            }
        }
    }
    Ok(failed.unwrap_or(ExitCode::SUCCESS))
}

/// Creates or updates one tenant: `created`, `configured` or `unchanged`,
/// and the version stored.
async fn apply_one(
    admin: &mut Admin,
    item: &Item,
    expected: Option<&str>,
) -> Result<(&'static str, String), tonic::Status> {
    let expected_version = match expected {
        Some(version) => version.to_owned(),
        None => {
            let request = admin.request(pb::GetTenantRequest {
                name: item.name.clone(),
            });
            match admin.client.get_tenant(request).await {
                Ok(current) => {
                    let current = current.into_inner();
                    if current.spec_yaml == item.spec {
                        return Ok(("unchanged", current.version));
                    }
                    current.version
                }
                Err(status) if status.code() == tonic::Code::NotFound => String::new(),
                Err(status) => return Err(status),
            }
        }
    };
    let outcome = if expected_version.is_empty() {
        "created"
    } else {
        "configured"
    };
    let request = admin.request(pb::PutTenantRequest {
        name: item.name.clone(),
        spec_yaml: item.spec.clone(),
        expected_version,
    });
    let tenant = admin.client.put_tenant(request).await?.into_inner();
    Ok((outcome, tenant.version))
}

async fn get(args: NameArgs) -> Result<ExitCode, ExitCode> {
    let mut admin = Admin::connect(&args.connection).await?;
    let request = admin.request(pb::GetTenantRequest { name: args.name });
    let tenant = match admin.client.get_tenant(request).await {
        Ok(t) => t.into_inner(),
        Err(status) => return Err(admin.fail(&status)),
    };
    if admin.json {
        println!(
            "{}",
            serde_json::json!({"name": tenant.name, "version": tenant.version, "spec_yaml": tenant.spec_yaml})
        );
    } else {
        println!("# tenant {} version {}", tenant.name, tenant.version);
        print!("{}", tenant.spec_yaml);
        if !tenant.spec_yaml.ends_with('\n') {
            println!();
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn delete(args: DeleteArgs) -> Result<ExitCode, ExitCode> {
    let mut admin = Admin::connect(&args.connection).await?;
    let request = admin.request(pb::DeleteTenantRequest {
        name: args.name.clone(),
        expected_version: args.expected_version.unwrap_or_default(),
    });
    match admin.client.delete_tenant(request).await {
        Ok(deleted) => {
            let version = deleted.into_inner().version;
            if admin.json {
                println!(
                    "{}",
                    serde_json::json!({"tenant": args.name, "deleted": version})
                );
            } else {
                println!("tenant {} deleted (version {version})", args.name);
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(status) => Err(admin.fail(&status)),
    }
}

async fn list(args: ListArgs) -> Result<ExitCode, ExitCode> {
    let mut admin = Admin::connect(&args.connection).await?;
    let mut page_token = String::new();
    let mut tenants = Vec::new();
    // Bounded: 100,000 pages of 1,000 is far beyond any store.
    for _ in 0..100_000 {
        let request = admin.request(pb::ListTenantsRequest {
            page_size: 1000,
            page_token: page_token.clone(),
        });
        let page = match admin.client.list_tenants(request).await {
            Ok(page) => page.into_inner(),
            Err(status) => return Err(admin.fail(&status)),
        };
        tenants.extend(page.tenants.into_iter().map(|t| (t.name, t.version)));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    if admin.json {
        let list: Vec<_> = tenants
            .iter()
            .map(|(name, version)| serde_json::json!({"name": name, "version": version}))
            .collect();
        println!("{}", serde_json::Value::Array(list));
    } else {
        println!("{:<40} VERSION", "NAME");
        for (name, version) in &tenants {
            println!("{name:<40} {version}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn secret_put(args: SecretArgs) -> Result<ExitCode, ExitCode> {
    let mut value = Vec::new();
    std::io::stdin()
        .read_to_end(&mut value)
        .map_err(|e| usage(&format!("cannot read the secret from standard input: {e}")))?;
    if value.ends_with(b"\n") {
        value.pop();
        if value.ends_with(b"\r") {
            value.pop();
        }
    }
    if value.is_empty() {
        eprintln!("toolgate: the secret read from standard input is empty");
        return Err(ExitCode::from(EXIT_USAGE));
    }
    let mut admin = Admin::connect(&args.connection).await?;
    let request = admin.request(pb::PutSecretRequest {
        tenant: args.tenant.clone(),
        name: args.name.clone(),
        value,
    });
    match admin.client.put_secret(request).await {
        Ok(stored) => {
            let version = stored.into_inner().version;
            if admin.json {
                println!(
                    "{}",
                    serde_json::json!({"tenant": args.tenant, "secret": args.name, "version": version})
                );
            } else {
                println!(
                    "secret {} of tenant {} stored (version {version})",
                    args.name, args.tenant
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(status) => Err(admin.fail(&status)),
    }
}

async fn secret_list(args: SecretsListArgs) -> Result<ExitCode, ExitCode> {
    let mut admin = Admin::connect(&args.connection).await?;
    let request = admin.request(pb::ListSecretsRequest {
        tenant: args.tenant,
    });
    let secrets = match admin.client.list_secrets(request).await {
        Ok(list) => list.into_inner().secrets,
        Err(status) => return Err(admin.fail(&status)),
    };
    if admin.json {
        let list: Vec<_> = secrets
            .iter()
            .map(|s| serde_json::json!({"name": s.name, "version": s.version, "updated_at_ms": s.updated_at_ms}))
            .collect();
        println!("{}", serde_json::Value::Array(list));
    } else {
        println!("{:<40} VERSION", "NAME");
        for secret in &secrets {
            println!("{:<40} {}", secret.name, secret.version);
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn secret_delete(args: SecretArgs) -> Result<ExitCode, ExitCode> {
    let mut admin = Admin::connect(&args.connection).await?;
    let request = admin.request(pb::DeleteSecretRequest {
        tenant: args.tenant.clone(),
        name: args.name.clone(),
    });
    match admin.client.delete_secret(request).await {
        Ok(_) => {
            if !admin.json {
                println!("secret {} of tenant {} deleted", args.name, args.tenant);
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(status) => Err(admin.fail(&status)),
    }
}

#[cfg(test)]
mod tests {
    use super::{Item, items};

    #[test]
    fn one_tenant_is_sent_as_written() {
        let text = "# the team's tenant\nname: acme\ntokens: [{stored: token}]\n";
        assert_eq!(
            items(text, None).unwrap(),
            vec![Item {
                name: "acme".into(),
                spec: text.into()
            }]
        );
        let unnamed = "tokens: [t]\n";
        assert_eq!(items(unnamed, Some("beta")).unwrap()[0].name, "beta");
        assert!(items(unnamed, None).unwrap_err().contains("--name"));
    }

    #[test]
    fn lists_and_documents_give_every_tenant() {
        let list = "tenants:\n  - name: a\n    tokens: [x]\n  - name: b\n    tokens: [y]\n";
        let names: Vec<_> = items(list, None)
            .unwrap()
            .into_iter()
            .map(|i| i.name)
            .collect();
        assert_eq!(names, ["a", "b"]);
        let documents = "name: a\ntokens: [x]\n---\nname: b\ntokens: [y]\n";
        let found = items(documents, None).unwrap();
        assert_eq!(found.len(), 2);
        assert!(found[1].spec.contains("name: b"), "{}", found[1].spec);
        assert!(items("---\n", None).unwrap_err().contains("no tenant"));
        assert!(
            items("tenants: 3\n", None)
                .unwrap_err()
                .contains("not a list")
        );
    }
}
