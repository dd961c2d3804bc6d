//! `toolgate state migrate-subjects`: moves the upstream tokens an earlier
//! release stored under a bare subject id (`alice`) to the key that says
//! who vouched for the subject (`token:alice`, `jwt:<issuer> alice`;
//! `callers::Subject::key`). Which one is right depends on the deployment
//! (did static-token callers name the subjects, or a JWT issuer?), so the
//! operator says it; nothing is guessed at start. Rows not moved are read
//! by nothing: their subjects consent again.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::callers::{Namespace, Subject};
use crate::state::{Rekeyed, StateError, StateStore, TokenKey};

/// How often a row rewritten while being moved (a running gateway
/// refreshed it) is tried again.
const ATTEMPTS: usize = 3;

/// `toolgate state migrate-subjects` arguments.
#[derive(Debug, clap::Args)]
pub struct MigrateSubjectsArgs {
    /// The YAML configuration file: its `state` block names the store and
    /// its keys.
    #[arg(long, short)]
    config: PathBuf,
    /// Who named the subjects of the rows: `token` (static-token callers,
    /// with `x-toolgate-subject`) or `jwt:ISSUER` (an issuer of
    /// `callers.jwt`, by its exact `issuer`).
    #[arg(long = "as", value_name = "token|jwt:ISSUER")]
    namespace: String,
    /// Only the rows of this tenant (repeatable); every tenant's without
    /// it.
    #[arg(long = "tenant", value_name = "NAME")]
    tenants: Vec<String>,
    /// Count what would be moved; change nothing.
    #[arg(long)]
    dry_run: bool,
}

/// What a migration did (or, dry, would do), in rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Migrated {
    /// Moved to the new key.
    pub moved: usize,
    /// Removed: the new key held a token already (a consent given since
    /// the upgrade), which is kept.
    pub superseded: usize,
    /// Left as they are: rewritten by a running gateway on every attempt
    /// (run the command again), or gone meanwhile.
    pub left: usize,
    /// Legacy rows whose id cannot name a subject (left as they are).
    pub invalid: usize,
    /// Rows in the new form already (or of the tenant itself), or of
    /// another tenant: untouched.
    pub untouched: usize,
}

/// Moves every token stored under a bare subject id (of `tenants`, or of
/// every tenant when empty) to the key `namespace` gives that id. Rows of
/// the tenant itself (`""`) and rows already keyed are left alone, so the
/// command can run again (or for another tenant) safely, also while
/// gateways serve.
///
/// # Errors
/// The store cannot be read or written, or a value does not open with the
/// configured keys.
pub async fn migrate_subjects(
    state: &StateStore,
    namespace: Namespace<'_>,
    tenants: &[String],
    dry_run: bool,
) -> Result<Migrated, StateError> {
    let mut done = Migrated::default();
    for from in state.token_keys().await? {
        let in_scope = tenants.is_empty() || tenants.contains(&from.tenant);
        if !in_scope || Subject::is_key(&from.subject) {
            done.untouched += 1;
            continue;
        }
        let Ok(subject) = Subject::named(namespace, &from.subject) else {
            done.invalid += 1;
            continue;
        };
        let to = TokenKey::new(&from.tenant, subject.key(), &from.server);
        if dry_run {
            match state.get_token(&to).await? {
                None => done.moved += 1,
                Some(_) => done.superseded += 1,
            }
            continue;
        }
        let mut outcome = Rekeyed::Changed;
        for _ in 0..ATTEMPTS {
            outcome = state.rekey_token(&from, &to).await?;
            if outcome != Rekeyed::Changed {
                break;
            }
        }
        match outcome {
            Rekeyed::Moved => done.moved += 1,
            Rekeyed::Superseded => done.superseded += 1,
            Rekeyed::Gone | Rekeyed::Changed => done.left += 1,
        }
    }
    Ok(done)
}

/// Runs the command: exit 0 when done, 64 for a bad configuration or
/// `--as`, 1 when the store cannot be opened or failed.
pub(super) async fn run(args: MigrateSubjectsArgs) -> ExitCode {
    let config = match super::load(&args.config) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let namespace = match Namespace::parse(&args.namespace) {
        Ok(namespace) => namespace,
        Err(reason) => {
            eprintln!("toolgate: --as {}: {reason}", args.namespace);
            return ExitCode::from(super::EXIT_CONFIG);
        }
    };
    if let Namespace::Jwt(issuer) = namespace
        && !config.callers.jwt.iter().any(|i| i.issuer == issuer)
    {
        eprintln!(
            "toolgate: --as jwt:{issuer}: no `callers.jwt` entry of {} has this issuer; its \
             callers could never reach the moved tokens",
            args.config.display()
        );
        return ExitCode::from(super::EXIT_CONFIG);
    }
    let keys: Vec<&str> = config.state.keys.iter().map(|k| k.expose()).collect();
    let state = crate::state::KeyRing::from_base64(&keys)
        .map_err(|e| format!("state.keys: {e}"))
        .and_then(|keys| {
            StateStore::open_lazy(config.state.url(), keys).map_err(|e| format!("state.url: {e}"))
        });
    let state = match state {
        Ok(state) => state,
        Err(e) => {
            eprintln!("toolgate: {}: {e}", args.config.display());
            return ExitCode::FAILURE;
        }
    };
    match migrate_subjects(&state, namespace, &args.tenants, args.dry_run).await {
        Ok(done) => {
            let verb = if args.dry_run { "would move" } else { "moved" };
            println!(
                "{verb} {} token(s) to `{}` subject keys; {} superseded by a newer consent \
                 (the old row {}); {} left (rewritten or gone meanwhile: run again); {} not a \
                 valid subject id; {} untouched",
                done.moved,
                args.namespace,
                done.superseded,
                if args.dry_run {
                    "would be removed"
                } else {
                    "removed"
                },
                done.left,
                done.invalid,
                done.untouched
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("toolgate: the state store: {e}");
            ExitCode::FAILURE
        }
    }
}
