//! Opening the store: which backend a URL names, the connection pool, and
//! the embedded migrations (the schema), applied once per store by
//! [`migrate`](super::migrate).

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

/// How many times a SQLite file is asked to switch to WAL mode while other
/// connections hold it (10 ms, 20 ms, ... apart: under 2 s in all).
const WAL_ATTEMPTS: u32 = 20;

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
    /// [`ACQUIRE_TIMEOUT`] (or, on SQLite, another process kept the write
    /// lock for more than 5 s), [`StateError::Migrate`] when the schema
    /// cannot be brought up to date. Processes connecting together take
    /// turns at migrating (`migrate`); on PostgreSQL one waits for another's
    /// migration as long as it lasts.
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
            url: url.into(),
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

    /// Whether this process has used the store (connected and migrated).
    pub(super) fn is_ready(&self) -> bool {
        self.migrated.initialized()
    }

    /// Applies the migrations once per store (retried after a failure), one
    /// process at a time ([`migrate`](super::migrate)).
    pub(super) async fn ready(&self) -> Result<&AnyPool, StateError> {
        self.migrated
            .get_or_try_init(|| async {
                if self.backend == Backend::Sqlite {
                    enable_wal(&self.pool).await?;
                }
                let migrator = match self.backend {
                    Backend::Sqlite => &SQLITE_MIGRATIONS,
                    Backend::Postgres => &POSTGRES_MIGRATIONS,
                };
                let mut conn = self.pool.acquire().await.map_err(StateError::from_sqlx)?;
                match super::migrate::run(&mut conn, self.backend, migrator, &self.keys).await {
                    Ok(resealed) => {
                        log_resealed(resealed);
                        Ok(())
                    }
                    Err(error) => {
                        // Whatever state the session is in, it is not reused.
                        let _ = conn.close().await;
                        Err(error)
                    }
                }
            })
            .await?;
        Ok(&self.pool)
    }
}

/// Puts a SQLite file in WAL mode (readers do not block the writer;
/// persistent in the file). Switching needs the file to itself, and SQLite
/// answers `SQLITE_BUSY` at once, without waiting, to all but one of several
/// connections switching together (gateways starting together on a new
/// file): those try again, at most [`WAL_ATTEMPTS`] times, a little later
/// each time, and then find the file in WAL mode already.
async fn enable_wal(pool: &AnyPool) -> Result<(), StateError> {
    let mut attempt = 1;
    loop {
        match sqlx::query("PRAGMA journal_mode = WAL").execute(pool).await {
            Ok(_) => return Ok(()),
            Err(error) if attempt < WAL_ATTEMPTS && is_sqlite_busy(&error) => {}
            Err(error) => return Err(StateError::from_sqlx(error)),
        }
        tokio::time::sleep(Duration::from_millis(10) * attempt).await;
        attempt += 1;
    }
}

/// `SQLITE_BUSY` or `SQLITE_LOCKED` (extended codes included).
fn is_sqlite_busy(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .filter(|db| db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some())
        .and_then(|db| db.code())
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| matches!(code & 0xff, 5 | 6))
}

fn log_resealed(resealed: super::migrate::Resealed) {
    if resealed.tokens > 0 {
        tracing::info!(
            rows = resealed.tokens,
            "stored tokens re-sealed for their version (migration 0003)"
        );
    }
    if resealed.unreadable > 0 {
        tracing::warn!(
            rows = resealed.unreadable,
            "stored tokens no configured key opens were left unreadable by migration 0003; delete them (those users consent again)"
        );
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
