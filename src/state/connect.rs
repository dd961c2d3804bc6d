//! Opening the store: which backend a URL names, the connection pool, and
//! the embedded migrations (the schema), applied once per store.

use sqlx::AnyPool;
use sqlx::any::AnyPoolOptions;
use std::time::Duration;

use super::{KeyRing, StateError, StateStore};

/// The store used when `state.url` is unset: a SQLite file in the working
/// directory, created if missing.
pub const DEFAULT_URL: &str = "sqlite://toolgate-state.db";

/// How long an operation waits for a connection before the store counts as
/// unavailable. Short, so a down store fails fast.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);

/// Connections per process (PostgreSQL). SQLite uses fewer: it has one writer.
const MAX_CONNECTIONS_POSTGRES: u32 = 8;
const MAX_CONNECTIONS_SQLITE: u32 = 4;

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

/// Which database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backend {
    /// An embedded SQLite file (`sqlite:`), for one process.
    Sqlite,
    /// A PostgreSQL server (`postgres:` or `postgresql:`), for replicas.
    Postgres,
}

impl StateStore {
    /// Connects to `url` (`sqlite:` or `postgres:`) and applies the embedded
    /// migrations. A SQLite file is created if missing (`mode=rwc` is added
    /// unless the URL names a `mode`); relative paths are relative to the
    /// working directory. Use [`DEFAULT_URL`] when `state.url` is unset.
    ///
    /// # Errors
    /// [`StateError::InvalidUrl`] for an unsupported or malformed URL,
    /// [`StateError::Unavailable`] when the database cannot be reached within
    /// [`ACQUIRE_TIMEOUT`], [`StateError::Migrate`] when the schema cannot be
    /// brought up to date.
    pub async fn connect(url: &str, keys: KeyRing) -> Result<StateStore, StateError> {
        let store = StateStore::open_lazy(url, keys)?;
        store.ready().await?;
        Ok(store)
    }

    /// Like [`StateStore::connect`], but connects and migrates on first use,
    /// so a process can start while the store is down: each operation then
    /// fails with [`StateError::Unavailable`] until the store is back.
    ///
    /// # Errors
    /// [`StateError::InvalidUrl`] for an unsupported or malformed URL.
    pub fn open_lazy(url: &str, keys: KeyRing) -> Result<StateStore, StateError> {
        sqlx::any::install_default_drivers();
        let (backend, url) = normalize_url(url)?;
        let max = match backend {
            Backend::Sqlite => MAX_CONNECTIONS_SQLITE,
            Backend::Postgres => MAX_CONNECTIONS_POSTGRES,
        };
        let pool = AnyPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_lazy(&url)
            .map_err(|_| StateError::InvalidUrl {
                reason: "cannot be parsed as a database URL",
            })?;
        Ok(StateStore {
            pool,
            backend,
            keys,
            migrated: std::sync::Arc::default(),
        })
    }

    /// The backend the URL named.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Closes the pool, waiting for connections in use to be returned.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Applies the migrations once per store (retried after a failure).
    pub(super) async fn ready(&self) -> Result<&AnyPool, StateError> {
        self.migrated
            .get_or_try_init(|| async {
                if self.backend == Backend::Sqlite {
                    // Readers do not block the writer; persistent in the file.
                    sqlx::query("PRAGMA journal_mode = WAL")
                        .execute(&self.pool)
                        .await
                        .map_err(StateError::from_sqlx)?;
                }
                let migrator = match self.backend {
                    Backend::Sqlite => &SQLITE_MIGRATIONS,
                    Backend::Postgres => &POSTGRES_MIGRATIONS,
                };
                migrator
                    .run(&self.pool)
                    .await
                    .map_err(StateError::from_migrate)
            })
            .await?;
        Ok(&self.pool)
    }
}

/// Checks the scheme and, for SQLite, asks for the file to be created.
fn normalize_url(url: &str) -> Result<(Backend, String), StateError> {
    let url = url.trim();
    let scheme = url.split_once(':').map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("sqlite") => {
            let query = url.split_once('?').map_or("", |(_, q)| q);
            let has_mode = query.split('&').any(|p| p.starts_with("mode="));
            let url = if has_mode || url.contains(":memory:") {
                url.to_string()
            } else if !url.contains('?') {
                format!("{url}?mode=rwc")
            } else {
                format!("{url}&mode=rwc")
            };
            Ok((Backend::Sqlite, url))
        }
        Some("postgres" | "postgresql") => Ok((Backend::Postgres, url.to_string())),
        Some(_) => Err(StateError::InvalidUrl {
            reason: "the scheme must be sqlite: or postgres:",
        }),
        None => Err(StateError::InvalidUrl {
            reason: "not a URL (expected sqlite://<path> or postgres://...)",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_urls_create_the_file() {
        assert_eq!(
            normalize_url(DEFAULT_URL).unwrap(),
            (
                Backend::Sqlite,
                "sqlite://toolgate-state.db?mode=rwc".to_string()
            )
        );
        assert_eq!(
            normalize_url("sqlite:///var/lib/tg.db?cache=shared")
                .unwrap()
                .1,
            "sqlite:///var/lib/tg.db?cache=shared&mode=rwc"
        );
        assert_eq!(
            normalize_url("sqlite://x.db?mode=ro").unwrap().1,
            "sqlite://x.db?mode=ro"
        );
        assert_eq!(
            normalize_url("postgres://u:p@h/db").unwrap(),
            (Backend::Postgres, "postgres://u:p@h/db".to_string())
        );
    }

    #[test]
    fn bad_urls_are_refused_without_echo() {
        let err = normalize_url("mysql://user:hunter2@h/db").unwrap_err();
        assert!(!err.to_string().contains("hunter2"));
        assert!(matches!(err, StateError::InvalidUrl { .. }));
        assert!(normalize_url("toolgate-state.db").is_err());
    }
}
