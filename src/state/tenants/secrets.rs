//! The secrets of tenants of the state store (`{stored: NAME}` in a
//! spec): written and deleted through the admin API, each sealed and bound
//! to its tenant and name; a write that changes what a stored tenant's
//! spec reads moves the tenant's version (and its token index) in the same
//! transaction.

use std::collections::HashMap;

use super::{
    ChangeKind, NAMES_PER_QUERY, SecretInfo, Staged, TenantWriteError, db, placeholders,
    secret_aad, spec_aad,
};
use crate::callers::TokenDigest;
use crate::config::Secret;
use crate::state::{Record, StateError, StateStore, get, now_ms};

impl StateStore {
    /// [`StateStore::stage_put_secret`], committed: returns the secret's
    /// version.
    ///
    /// # Errors
    /// As [`StateStore::stage_put_secret`].
    pub async fn put_secret(
        &self,
        tenant: &str,
        name: &str,
        value: &[u8],
        tokens: Option<&[TokenDigest]>,
    ) -> Result<i64, TenantWriteError> {
        let staged = self.stage_put_secret(tenant, name, value, tokens).await?;
        Ok(staged.commit().await?.0)
    }

    /// Deletes secret `name` of `tenant`. Returns whether it existed.
    ///
    /// # Errors
    /// The store's error.
    pub async fn delete_secret(&self, tenant: &str, name: &str) -> Result<bool, StateError> {
        self.stage_delete_secret(tenant, name).await?.commit().await
    }

    /// Stores secret `name` of `tenant` (sealed, bound to both), and, when
    /// the tenant exists, writes a change for it (its version grows, so
    /// every replica loads it again with the new value) with `tokens` as
    /// its new token index when given (the secret was one of its tokens).
    /// Not committed yet: returns the secret's version and the tenant's new
    /// one (when the tenant exists).
    ///
    /// # Errors
    /// [`TenantWriteError::TokenTaken`], or the store's error.
    pub async fn stage_put_secret(
        &self,
        tenant: &str,
        name: &str,
        value: &[u8],
        tokens: Option<&[TokenDigest]>,
    ) -> Result<Staged<(i64, Option<i64>)>, TenantWriteError> {
        self.stage_put_secret_with_approvers(tenant, name, value, tokens.map(|t| (t, None)))
            .await
    }

    /// [`StateStore::stage_put_secret`], with the tenant's approver tokens'
    /// digests too (`tokens`: the callers' and, when given, the
    /// approvers').
    ///
    /// # Errors
    /// As [`StateStore::stage_put_secret`].
    pub async fn stage_put_secret_with_approvers(
        &self,
        tenant: &str,
        name: &str,
        value: &[u8],
        tokens: Option<(&[TokenDigest], Option<&[TokenDigest]>)>,
    ) -> Result<Staged<(i64, Option<i64>)>, TenantWriteError> {
        let mut tx = self.begin_tenant_write().await?;
        let now = now_ms();
        let row = sqlx::query(
            "INSERT INTO toolgate_tenant_secrets (tenant, name, version, sealed, updated_at_ms) \
             VALUES ($1, $2, 1, $3, $4) ON CONFLICT (tenant, name) DO UPDATE \
             SET version = toolgate_tenant_secrets.version + 1, sealed = excluded.sealed, \
                 updated_at_ms = excluded.updated_at_ms \
             RETURNING version",
        )
        .bind(tenant)
        .bind(name)
        .bind(self.keys.seal(value, &secret_aad(tenant, name)))
        .bind(now)
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?;
        let secret_version: i64 = get(&row, 0, Record::TenantSecret)?;
        let mut tenant_version = None;
        let stored = sqlx::query("SELECT version, sealed FROM toolgate_tenants WHERE name = $1")
            .bind(tenant)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?;
        if let Some(stored) = stored {
            // The spec is sealed for its version: opened at the old one,
            // sealed again for the new one.
            let old: i64 = get(&stored, 0, Record::Tenant)?;
            let sealed: Vec<u8> = get(&stored, 1, Record::Tenant)?;
            let spec = self.open(&sealed, &spec_aad(tenant, old), Record::Tenant)?;
            let version = Self::insert_change(&mut tx, tenant, ChangeKind::Secret).await?;
            tenant_version = Some(version);
            sqlx::query(
                "UPDATE toolgate_tenants SET version = $2, sealed = $3, updated_at_ms = $4 \
                 WHERE name = $1",
            )
            .bind(tenant)
            .bind(version)
            .bind(self.keys.seal(&spec, &spec_aad(tenant, version)))
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
            if let Some((tokens, approvers)) = tokens {
                Self::replace_tokens(&mut tx, tenant, tokens, approvers).await?;
            }
            self.notify(&mut tx, tenant).await?;
        }
        Ok(Staged {
            tx,
            value: (secret_version, tenant_version),
        })
    }

    /// Deletes secret `name` of `tenant`, not committed yet. Its value:
    /// whether the secret existed.
    ///
    /// # Errors
    /// The store's error.
    pub async fn stage_delete_secret(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<Staged<bool>, StateError> {
        let mut tx = self.begin_tenant_write().await?;
        let done =
            sqlx::query("DELETE FROM toolgate_tenant_secrets WHERE tenant = $1 AND name = $2")
                .bind(tenant)
                .bind(name)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        Ok(Staged {
            tx,
            value: done.rows_affected() > 0,
        })
    }

    /// The names and versions of `tenant`'s secrets, by name.
    ///
    /// # Errors
    /// The store's error.
    pub async fn list_secrets(&self, tenant: &str) -> Result<Vec<SecretInfo>, StateError> {
        let pool = self.ready().await?;
        let rows = sqlx::query(
            "SELECT name, version, updated_at_ms FROM toolgate_tenant_secrets \
             WHERE tenant = $1 ORDER BY name",
        )
        .bind(tenant)
        .fetch_all(pool)
        .await
        .map_err(db)?;
        rows.iter()
            .map(|row| {
                Ok(SecretInfo {
                    name: get(row, 0, Record::TenantSecret)?,
                    version: get(row, 1, Record::TenantSecret)?,
                    updated_at_ms: get(row, 2, Record::TenantSecret)?,
                })
            })
            .collect()
    }

    /// The values of `tenant`'s secrets named in `names`, opened (absent
    /// names are left out).
    ///
    /// # Errors
    /// The store's error, or a value that does not open (or is not UTF-8).
    pub async fn secrets(
        &self,
        tenant: &str,
        names: &[String],
    ) -> Result<HashMap<String, Secret>, StateError> {
        let pool = self.ready().await?;
        let mut values = HashMap::with_capacity(names.len());
        for chunk in names.chunks(NAMES_PER_QUERY) {
            let sql = format!(
                "SELECT name, sealed FROM toolgate_tenant_secrets \
                 WHERE tenant = $1 AND name IN ({})",
                placeholders(2, chunk.len())
            );
            let mut query = sqlx::query(&sql).bind(tenant);
            for name in chunk {
                query = query.bind(name);
            }
            for row in query.fetch_all(pool).await.map_err(db)? {
                let name: String = get(&row, 0, Record::TenantSecret)?;
                let sealed: Vec<u8> = get(&row, 1, Record::TenantSecret)?;
                let value = self.open(&sealed, &secret_aad(tenant, &name), Record::TenantSecret)?;
                let value = String::from_utf8(value).map_err(|_| StateError::Corrupt {
                    record: Record::TenantSecret,
                })?;
                values.insert(name, Secret::sourced(value));
            }
        }
        Ok(values)
    }
}
