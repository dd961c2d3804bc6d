//! The index of the tenants' token digests: a caller's token selects its
//! tenant (rows `0..`, its place in the spec's `tokens`); an approver
//! token (`call_approvals.approver_tokens`, rows `-1, -2, ...`) finds its
//! tenant for the CallApprovalsService only. The digest is the key, so one
//! token never selects two tenants.

use sqlx::{Any, Transaction};

use super::{TenantWriteError, db};
use crate::callers::TokenDigest;
use crate::state::{Record, StateError, StateStore, get};

impl StateStore {
    /// Replaces `tenant`'s token index with `tokens` (in spec order, rows
    /// `0..`) and `approver_tokens` (rows `-1, -2, ...`: negative indices
    /// mark an approver token, which selects no tenant for a caller;
    /// `None`: the approver rows are kept).
    pub(super) async fn replace_tokens(
        tx: &mut Transaction<'static, Any>,
        tenant: &str,
        tokens: &[TokenDigest],
        approver_tokens: Option<&[TokenDigest]>,
    ) -> Result<(), TenantWriteError> {
        // Without approver tokens given, their rows stay as they are.
        let delete = if approver_tokens.is_some() {
            "DELETE FROM toolgate_tenant_tokens WHERE tenant = $1"
        } else {
            "DELETE FROM toolgate_tenant_tokens WHERE tenant = $1 AND token_index >= 0"
        };
        sqlx::query(delete)
            .bind(tenant)
            .execute(&mut **tx)
            .await
            .map_err(db)?;
        let approver_tokens = approver_tokens.unwrap_or_default();
        let rows = tokens
            .iter()
            .enumerate()
            .map(|(index, digest)| (i64::try_from(index).unwrap_or(i64::MAX), digest))
            .chain(
                approver_tokens
                    .iter()
                    .enumerate()
                    .map(|(index, digest)| (-1 - i64::try_from(index).unwrap_or(0), digest)),
            );
        for (row_index, digest) in rows {
            let written = sqlx::query(
                "INSERT INTO toolgate_tenant_tokens (digest, tenant, token_index) \
                 VALUES ($1, $2, $3) ON CONFLICT (digest) DO NOTHING RETURNING token_index",
            )
            .bind(digest.as_bytes().to_vec())
            .bind(tenant)
            .bind(row_index)
            .fetch_optional(&mut **tx)
            .await
            .map_err(db)?;
            if written.is_some() {
                continue;
            }
            let owner = sqlx::query("SELECT tenant FROM toolgate_tenant_tokens WHERE digest = $1")
                .bind(digest.as_bytes().to_vec())
                .fetch_one(&mut **tx)
                .await
                .map_err(db)?;
            let owner: String = get(&owner, 0, Record::TenantChange)?;
            // The same token twice in one spec selects this tenant once
            // (an approver token equal to one of the tenant's own tokens
            // is refused by validation first).
            if owner != tenant {
                return Err(match usize::try_from(row_index) {
                    Ok(index) => TenantWriteError::TokenTaken {
                        index,
                        tenant: owner,
                    },
                    Err(_) => TenantWriteError::ApproverTokenTaken {
                        index: usize::try_from(-1 - row_index).unwrap_or(0),
                        tenant: owner,
                    },
                });
            }
        }
        Ok(())
    }

    /// The tenant a token with this digest selects, and the token's index
    /// in its spec's `tokens`.
    ///
    /// # Errors
    /// The store's error.
    pub async fn tenant_for_token(
        &self,
        digest: &TokenDigest,
    ) -> Result<Option<(String, usize)>, StateError> {
        let pool = self.ready().await?;
        // An approver token's row (a negative index) selects no tenant.
        let row = sqlx::query(
            "SELECT tenant, token_index FROM toolgate_tenant_tokens \
             WHERE digest = $1 AND token_index >= 0",
        )
        .bind(digest.as_bytes().to_vec())
        .fetch_optional(pool)
        .await
        .map_err(db)?;
        row.map(|row| {
            let tenant: String = get(&row, 0, Record::TenantChange)?;
            let index: i64 = get(&row, 1, Record::TenantChange)?;
            let index = usize::try_from(index).map_err(|_| StateError::Corrupt {
                record: Record::TenantChange,
            })?;
            Ok((tenant, index))
        })
        .transpose()
    }

    /// The tenant one of whose approver tokens has this digest.
    ///
    /// # Errors
    /// The store's error.
    pub async fn tenant_for_approver_token(
        &self,
        digest: &TokenDigest,
    ) -> Result<Option<String>, StateError> {
        let pool = self.ready().await?;
        let row = sqlx::query(
            "SELECT tenant FROM toolgate_tenant_tokens WHERE digest = $1 AND token_index < 0",
        )
        .bind(digest.as_bytes().to_vec())
        .fetch_optional(pool)
        .await
        .map_err(db)?;
        row.map(|row| get(&row, 0, Record::TenantChange))
            .transpose()
    }
}
