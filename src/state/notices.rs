//! PostgreSQL's `NOTIFY`, as the store's writes announce themselves to the
//! other replicas: tenant writes (`toolgate_tenants`, the tenant's name)
//! and call approvals requested or decided (`toolgate_call_approvals`, the
//! approval's id). SQLite has one process and no notices: listening there
//! is `None`, and its readers poll.

use super::{Backend, StateError, StateStore};

/// The payloads announced on one channel, in order.
pub struct Notices {
    listener: sqlx::postgres::PgListener,
    /// What is lost when the connection goes, for the error.
    what: &'static str,
}

impl std::fmt::Debug for Notices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notices").field("what", &self.what).finish()
    }
}

impl Notices {
    /// The next payload announced by any replica.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the connection is lost (listen
    /// again; what was announced meanwhile is lost: resync).
    pub async fn next(&mut self) -> Result<String, StateError> {
        match self.listener.try_recv().await {
            Ok(Some(notice)) => Ok(notice.payload().to_owned()),
            Ok(None) => Err(StateError::Unavailable(sqlx::Error::Io(
                std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    format!("the connection listening for {} was lost", self.what),
                ),
            ))),
            Err(error) => Err(StateError::Unavailable(error)),
        }
    }
}

impl StateStore {
    /// Listens on `channel` (PostgreSQL only; `None` on SQLite), on a
    /// connection of its own; `what` names what it announces. Listening
    /// has begun when this returns.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub(super) async fn listen(
        &self,
        channel: &str,
        what: &'static str,
    ) -> Result<Option<Notices>, StateError> {
        if self.backend != Backend::Postgres {
            return Ok(None);
        }
        let mut listener = sqlx::postgres::PgListener::connect(&self.url)
            .await
            .map_err(StateError::Unavailable)?;
        listener
            .listen(channel)
            .await
            .map_err(StateError::Unavailable)?;
        Ok(Some(Notices { listener, what }))
    }
}
