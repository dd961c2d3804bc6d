//! Errors of the state store. "The store cannot be reached" is its own
//! variant so callers answer `UNAVAILABLE` + `RetryInfo`; everything else is a
//! fault that retrying will not fix. No error holds a stored value, a key or
//! a token; sqlx errors are kept as sources (they carry no bound values).

use super::keyring::{KeyError, OpenError};

/// What was being read when a value could not be opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Record {
    /// An upstream token.
    Token,
    /// An OAuth client registration.
    Client,
    /// A pending authorization flow.
    Pending,
    /// A consent held until its application confirms it.
    Held,
    /// A task (SEP-2663) a worker follows.
    Task,
    /// A tenant's spec written through the admin API.
    Tenant,
    /// A secret of a tenant written through the admin API.
    TenantSecret,
    /// An entry of the tenants' change log, or of their token index.
    TenantChange,
    /// A call approval (a tool call held for a person's decision).
    CallApproval,
    /// An idempotency key's record of a tool call.
    IdempotencyKey,
}

impl std::fmt::Display for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Record::Token => "token",
            Record::Client => "OAuth client",
            Record::Pending => "pending authorization",
            Record::Held => "held consent",
            Record::Task => "task",
            Record::Tenant => "tenant spec",
            Record::TenantSecret => "tenant secret",
            Record::TenantChange => "tenant change",
            Record::CallApproval => "call approval",
            Record::IdempotencyKey => "idempotency key",
        })
    }
}

/// An error of the state store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// The store cannot be reached now (connection refused or lost, pool
    /// timeout, database shutting down, SQLite busy). Retryable.
    #[error("state store unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// `state.url` is not a `sqlite:` or `postgres:` URL, or does not parse.
    /// The URL itself is not repeated (it may hold a password).
    #[error("state.url: {reason}")]
    InvalidUrl {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The encryption keys are invalid.
    #[error(transparent)]
    Keys(#[from] KeyError),
    /// Applying the embedded migrations failed for a reason other than
    /// reachability (for instance a database migrated by a newer toolgate).
    #[error("state store migration failed")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    /// A stored value cannot be opened with any configured key: the key that
    /// sealed it was removed from `state.keys`, or the row was altered or
    /// copied from another row.
    #[error("stored {record} cannot be decrypted")]
    Decrypt {
        /// What was being read.
        record: Record,
        /// Why (key id, not key).
        #[source]
        cause: OpenError,
    },
    /// A row does not have the expected shape.
    #[error("stored {record} is corrupt")]
    Corrupt {
        /// What was being read.
        record: Record,
    },
    /// Other writers changed the row at every attempt of a write that must
    /// know the row's version (a token is sealed for the version it is
    /// written with). Retryable.
    #[error("stored {record} kept changing while being written")]
    Contended {
        /// What was being written.
        record: Record,
    },
    /// The database refused a statement (constraint, permission, SQL).
    #[error("state store query failed")]
    Database(#[source] sqlx::Error),
    /// What is kept in this process's memory instead of a store is at its
    /// bound (the text says which). Retryable once entries expire.
    #[error("{0}")]
    Full(String),
}

impl StateError {
    /// True when retrying later may succeed (the store was unreachable, or
    /// a write kept losing to others).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            StateError::Unavailable(_) | StateError::Contended { .. } | StateError::Full(_)
        )
    }

    /// Classifies a sqlx error: reachability problems become
    /// [`StateError::Unavailable`], the rest [`StateError::Database`].
    pub(crate) fn from_sqlx(error: sqlx::Error) -> StateError {
        if is_unreachable(&error) {
            StateError::Unavailable(error)
        } else {
            StateError::Database(error)
        }
    }

    pub(crate) fn from_migrate(error: sqlx::migrate::MigrateError) -> StateError {
        match error {
            sqlx::migrate::MigrateError::Execute(inner) if is_unreachable(&inner) => {
                StateError::Unavailable(inner)
            }
            other => StateError::Migrate(other),
        }
    }
}

fn is_unreachable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => {
            let Some(code) = db.code() else { return false };
            if db
                .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                .is_some()
            {
                // SQLSTATE class 08 connection exception, 57P01-57P03 shutdown
                // or cannot connect now, 53300 too many connections.
                code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03" | "53300")
            } else if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                // Extended result code whose primary code is 5 BUSY or 6 LOCKED.
                code.parse::<i32>().is_ok_and(|c| matches!(c & 0xff, 5 | 6))
            } else {
                false
            }
        }
        _ => false,
    }
}
