//! The `toolgate.admin.v1.Admin` service: tenants and their secrets in
//! the state store. Each RPC authenticates its caller (`auth`), checks
//! its request, validates a spec against the configuration in force
//! exactly as a tenant of the file would be (plus what a tenant of the
//! admin API may not reach), writes through the state store, counts
//! itself (`toolgate_admin_requests_total`) and, when it changed
//! something, writes an audit record. Errors map to statuses in `status`.

use std::sync::Arc;

use base64::Engine as _;
use tonic::{Request, Response, Status};

use super::auth::{AdminCaller, authenticate};
use super::server::admin_server::Admin;
use super::{AdminError, status};
use crate::audit::{AdminChange, Audit, AuditSlot, CallerRecord};
use crate::callers::TokenDigest;
use crate::config::names::{is_valid_secret_name, is_valid_tenant_name};
use crate::config::{Config, Environment, Secret, SpecSource, TenantOrigin, TenantSpec};
use crate::pb::admin as pb;
use crate::registry::Registry;
use crate::state::StateStore;
use crate::state::tenants::{Expect, Staged, StoredTenant, TenantWriteError};
use crate::telemetry::Metrics;

/// Tenants in one ListTenants page unless the request says otherwise.
pub const DEFAULT_PAGE_SIZE: u32 = 100;
/// Most tenants in one ListTenants page.
pub const MAX_PAGE_SIZE: u32 = 1000;
/// Largest secret value, in bytes.
pub const MAX_SECRET_BYTES: usize = 64 << 10;

/// What a page token holds before its base64: a version, so that the
/// format can change.
const PAGE_TOKEN_PREFIX: &str = "v1:";

/// The configuration in force (its tenants are not needed): what a spec
/// is validated against, and where the admin tokens are.
pub trait ConfigInForce: Send + Sync + 'static {
    /// The configuration in force now.
    fn current(&self) -> Arc<Config>;
}

impl ConfigInForce for arc_swap::ArcSwap<Config> {
    fn current(&self) -> Arc<Config> {
        self.load_full()
    }
}

/// The registry's configuration in force, which every applied reload
/// replaces; the one the gateway started with until the registry has one.
#[derive(Debug)]
pub struct Followed {
    /// The registry whose configuration is followed.
    pub registry: Arc<crate::registry::Registry>,
    /// The configuration the gateway started with.
    pub initial: Arc<Config>,
}

impl ConfigInForce for Followed {
    fn current(&self) -> Arc<Config> {
        self.registry
            .store_config()
            .unwrap_or_else(|| self.initial.clone())
    }
}

/// The admin service.
#[derive(Clone)]
pub struct AdminService {
    store: StateStore,
    registry: Arc<Registry>,
    config: Arc<dyn ConfigInForce>,
    env: Arc<dyn Environment>,
    audit: Audit,
    metrics: Arc<Metrics>,
    /// The rate of writes, all callers together (`admin.write_rate_per_second`,
    /// `admin.write_burst`, as the gateway started with).
    writes: Arc<governor::DefaultDirectRateLimiter>,
}

impl std::fmt::Debug for AdminService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminService").finish_non_exhaustive()
    }
}

impl AdminService {
    /// The service over `store`, refusing what `registry`'s file (or
    /// `tenants_dir`) tenants define, validating against `config`'s
    /// configuration in force (with `env` for `admin.host_secrets.env`).
    pub fn new(
        store: StateStore,
        registry: Arc<Registry>,
        config: Arc<dyn ConfigInForce>,
        env: Arc<dyn Environment>,
        audit: Audit,
        metrics: Arc<Metrics>,
    ) -> Self {
        let (rate, burst) = config.current().admin.as_ref().map_or(
            (
                crate::config::DEFAULT_ADMIN_WRITE_RATE,
                crate::config::DEFAULT_ADMIN_WRITE_BURST,
            ),
            |admin| (admin.write_rate, admin.write_burst),
        );
        let writes =
            governor::RateLimiter::direct(governor::Quota::per_second(rate).allow_burst(burst));
        Self {
            store,
            registry,
            config,
            env,
            audit,
            metrics,
            writes: Arc::new(writes),
        }
    }

    /// Authenticates a write's caller, then takes one token of the rate of
    /// writes (so that unauthenticated callers take none).
    async fn writer<T>(&self, request: &Request<T>) -> Result<AdminCaller, AdminError> {
        let caller = self.caller(request).await?;
        if let Err(not_until) = self.writes.check() {
            use governor::clock::Clock as _;
            let wait = not_until.wait_time_from(governor::clock::DefaultClock::default().now());
            return Err(AdminError::WriteRateLimited { wait });
        }
        Ok(caller)
    }

    /// With `audit.required`, a place in the audit writer's queue for the
    /// record of `attempt`, taken before anything is changed: refused when
    /// the sink is known to be broken or the queue has no room (the
    /// refusal is queued as a record too: the writer tries the sink again
    /// with it).
    async fn audit_slot(&self, attempt: AdminChange<'_>) -> Result<Option<AuditSlot>, AdminError> {
        if !self.audit.is_required() {
            return Ok(None);
        }
        let slot = if self.audit.admits_calls() {
            self.audit.reserve().await.ok().flatten()
        } else {
            None
        };
        if slot.is_none() {
            let error = AdminError::AuditUnavailable;
            let (code, reason) = status::classify(&error);
            self.audit.admin_not_made(
                attempt,
                crate::audit::Outcome::Refused,
                crate::audit::code_name(code),
                reason,
            );
            return Err(error);
        }
        Ok(slot)
    }

    /// Records `change`, then commits the write it describes. With
    /// `audit.required`, a record that cannot be written rolls the write
    /// back (AUDIT_UNAVAILABLE: nothing was changed); a commit that fails
    /// after its record was written is recorded as not made.
    async fn commit<T>(
        &self,
        slot: Option<AuditSlot>,
        staged: Staged<T>,
        change: AdminChange<'_>,
    ) -> Result<T, AdminError> {
        if let Err(failure) = self.audit.admin(slot, change.clone()).await {
            tracing::error!(rpc = change.rpc, tenant = %change.tenant, %failure, "admin: the change's audit record cannot be written; the change is not made (audit.required)");
            drop(staged);
            return Err(AdminError::AuditUnavailable);
        }
        match staged.commit().await {
            Ok(value) => Ok(value),
            Err(error) => {
                let error = AdminError::Store(error);
                let (code, reason) = status::classify(&error);
                self.audit.admin_not_made(
                    change,
                    crate::audit::Outcome::Failed,
                    crate::audit::code_name(code),
                    reason,
                );
                Err(error)
            }
        }
    }

    /// Authenticates the request's caller.
    async fn caller<T>(&self, request: &Request<T>) -> Result<AdminCaller, AdminError> {
        let config = self.config.current();
        let Some(admin) = config.admin.as_ref() else {
            return Err(AdminError::Unauthenticated(
                "the admin API is not configured",
            ));
        };
        authenticate(admin, &self.registry.jwt_callers(), request.metadata()).await
    }

    /// Counts the request and turns its error into a status.
    fn finish<T>(&self, rpc: &str, result: Result<T, AdminError>) -> Result<Response<T>, Status> {
        let code = match &result {
            Ok(_) => tonic::Code::Ok,
            Err(e) => status::classify(e).0,
        };
        self.metrics
            .admin_request(rpc, crate::audit::code_name(code));
        result.map(Response::new).map_err(Status::from)
    }

    /// The stored secrets `spec` reads, and the tenant it validates to
    /// against the configuration in force.
    async fn validate(
        &self,
        name: &str,
        spec_yaml: &str,
        replaced: Option<(&str, &str)>,
    ) -> Result<crate::config::TenantConfig, AdminError> {
        let spec = TenantSpec::parse(spec_yaml, Some(name)).map_err(AdminError::InvalidSpec)?;
        let names: Vec<String> = spec.stored_references().into_iter().collect();
        let mut stored = self.store.secrets(name, &names).await?;
        if let Some((secret, value)) = replaced
            && names.iter().any(|n| n == secret)
        {
            stored.insert(secret.to_owned(), Secret::sourced(value));
        }
        let config = self.config.current();
        config
            .validate_tenant(
                spec,
                SpecSource::Store {
                    stored: &stored,
                    version: 0,
                },
                self.env.as_ref(),
            )
            .map_err(AdminError::InvalidSpec)
    }

    /// The digests of a validated tenant's tokens and of its approver
    /// tokens, refused when one is a token of a tenant of the file or
    /// `tenants_dir`.
    fn digests(
        &self,
        tenant: &crate::config::TenantConfig,
    ) -> Result<(Vec<TokenDigest>, Vec<TokenDigest>), AdminError> {
        let mut digests = Vec::with_capacity(tenant.tokens.len());
        for (index, token) in tenant.tokens.iter().enumerate() {
            let digest = TokenDigest::of(token.expose());
            if let Some((owner, origin)) = self.registry.token_owner_outside_store(&digest) {
                return Err(AdminError::TokenTaken {
                    name: tenant.name.clone(),
                    index,
                    owner,
                    origin,
                });
            }
            digests.push(digest);
        }
        let mut approvers = Vec::new();
        for (index, approver) in tenant.call_approvals.approver_tokens.iter().enumerate() {
            let digest = TokenDigest::of(approver.token.expose());
            if let Some((owner, origin)) = self.registry.token_owner_outside_store(&digest) {
                return Err(AdminError::ApproverTokenTaken {
                    name: tenant.name.clone(),
                    index,
                    owner,
                    origin: Some(origin),
                });
            }
            approvers.push(digest);
        }
        Ok((digests, approvers))
    }

    async fn put_tenant_inner(
        &self,
        request: Request<pb::PutTenantRequest>,
    ) -> Result<pb::Tenant, AdminError> {
        let caller = self.writer(&request).await?;
        let peer = peer(&request);
        let req = request.into_inner();
        tenant_name(&req.name, "name")?;
        let expect = match expected_version(&req.expected_version)? {
            None => Expect::Absent,
            Some(v) => Expect::Version(v),
        };
        if let Some(origin) = self.registry.defined_outside_store(&req.name) {
            return Err(AdminError::DefinedElsewhere {
                name: req.name,
                origin,
            });
        }
        let tenant = self.validate(&req.name, &req.spec_yaml, None).await?;
        let (digests, approvers) = self.digests(&tenant)?;
        let slot = self
            .audit_slot(attempt(&caller, &peer, "PutTenant", &req.name, None))
            .await?;
        let staged = self
            .store
            .stage_put_tenant_with_approvers(
                &req.name,
                &req.spec_yaml,
                expect,
                &digests,
                Some(&approvers),
            )
            .await
            .map_err(|e| write_error(&req.name, expect, e))?;
        let version = *staged.value();
        let change = AdminChange {
            rpc: "PutTenant",
            caller: caller_record(&caller),
            peer,
            tenant: &req.name,
            secret: None,
            old_version: match expect {
                Expect::Version(v) => Some(v),
                Expect::Absent | Expect::Any => None,
            },
            new_version: Some(version),
        };
        self.commit(slot, staged, change).await?;
        tracing::info!(tenant = %req.name, version, caller = %caller, "admin: tenant written");
        Ok(pb::Tenant {
            name: req.name,
            version: version.to_string(),
            spec_yaml: req.spec_yaml,
        })
    }

    async fn get_tenant_inner(
        &self,
        request: Request<pb::GetTenantRequest>,
    ) -> Result<pb::Tenant, AdminError> {
        self.caller(&request).await?;
        let name = request.into_inner().name;
        tenant_name(&name, "name")?;
        match self.store.get_tenant(&name).await? {
            Some(tenant) => Ok(to_pb(tenant)),
            None => Err(AdminError::TenantNotFound { name }),
        }
    }

    async fn delete_tenant_inner(
        &self,
        request: Request<pb::DeleteTenantRequest>,
    ) -> Result<pb::DeleteTenantResponse, AdminError> {
        let caller = self.writer(&request).await?;
        let peer = peer(&request);
        let req = request.into_inner();
        tenant_name(&req.name, "name")?;
        let expect = match expected_version(&req.expected_version)? {
            None => Expect::Any,
            Some(v) => Expect::Version(v),
        };
        let slot = self
            .audit_slot(attempt(&caller, &peer, "DeleteTenant", &req.name, None))
            .await?;
        let staged = self
            .store
            .stage_delete_tenant(&req.name, expect)
            .await
            .map_err(|e| write_error(&req.name, expect, e))?;
        let version = *staged.value();
        let change = AdminChange {
            rpc: "DeleteTenant",
            caller: caller_record(&caller),
            peer,
            tenant: &req.name,
            secret: None,
            old_version: Some(version),
            new_version: None,
        };
        self.commit(slot, staged, change).await?;
        tracing::info!(tenant = %req.name, version, caller = %caller, "admin: tenant deleted");
        Ok(pb::DeleteTenantResponse {
            version: version.to_string(),
        })
    }

    async fn list_tenants_inner(
        &self,
        request: Request<pb::ListTenantsRequest>,
    ) -> Result<pb::ListTenantsResponse, AdminError> {
        self.caller(&request).await?;
        let req = request.into_inner();
        let size = match req.page_size {
            0 => DEFAULT_PAGE_SIZE,
            n => n.min(MAX_PAGE_SIZE),
        };
        let after = if req.page_token.is_empty() {
            None
        } else {
            Some(read_page_token(&req.page_token)?)
        };
        let mut tenants = self.store.list_tenants(after.as_deref(), size + 1).await?;
        let more = tenants.len() > size as usize;
        tenants.truncate(size as usize);
        let next_page_token = match tenants.last() {
            Some(last) if more => page_token(&last.name),
            _ => String::new(),
        };
        Ok(pb::ListTenantsResponse {
            tenants: tenants.into_iter().map(to_pb).collect(),
            next_page_token,
        })
    }

    async fn put_secret_inner(
        &self,
        request: Request<pb::PutSecretRequest>,
    ) -> Result<pb::PutSecretResponse, AdminError> {
        let caller = self.writer(&request).await?;
        let peer = peer(&request);
        let req = request.into_inner();
        tenant_name(&req.tenant, "tenant")?;
        if !is_valid_secret_name(&req.name) {
            return Err(AdminError::InvalidName { field: "name" });
        }
        if req.value.is_empty() {
            return Err(AdminError::InvalidSecret("must not be empty"));
        }
        if req.value.len() > MAX_SECRET_BYTES {
            return Err(AdminError::InvalidSecret("at most 64 KiB"));
        }
        let value = std::str::from_utf8(&req.value)
            .map_err(|_| AdminError::InvalidSecret("must be UTF-8 text"))?;
        // A stored tenant that reads the secret: its tokens may change
        // with it (and none may become another tenant's).
        let stored = self.store.get_tenant(&req.tenant).await?;
        let mut tokens = None;
        if let Some(tenant) = &stored {
            let spec = TenantSpec::parse(&tenant.spec, Some(&tenant.name));
            let reads = spec.is_ok_and(|s| s.stored_references().contains(&req.name));
            if reads {
                match self
                    .validate(&req.tenant, &tenant.spec, Some((&req.name, value)))
                    .await
                {
                    Ok(valid) => tokens = Some(self.digests(&valid)?),
                    Err(AdminError::InvalidSpec(spec)) => tracing::warn!(
                        tenant = %req.tenant,
                        errors = spec.errors.len(),
                        "admin: the stored spec does not validate with the new secret; its token index is left as it was"
                    ),
                    Err(other) => return Err(other),
                }
            }
        }
        let slot = self
            .audit_slot(attempt(
                &caller,
                &peer,
                "PutSecret",
                &req.tenant,
                Some(&req.name),
            ))
            .await?;
        let staged = self
            .store
            .stage_put_secret_with_approvers(
                &req.tenant,
                &req.name,
                value.as_bytes(),
                tokens
                    .as_ref()
                    .map(|(tokens, approvers)| (tokens.as_slice(), Some(approvers.as_slice()))),
            )
            .await
            .map_err(|e| write_error(&req.tenant, Expect::Any, e))?;
        let (version, new_version) = *staged.value();
        let change = AdminChange {
            rpc: "PutSecret",
            caller: caller_record(&caller),
            peer,
            tenant: &req.tenant,
            secret: Some(&req.name),
            old_version: stored.as_ref().map(|t| t.version),
            new_version,
        };
        self.commit(slot, staged, change).await?;
        tracing::info!(tenant = %req.tenant, secret = %req.name, version, caller = %caller, "admin: secret written");
        Ok(pb::PutSecretResponse {
            version: version.to_string(),
        })
    }

    async fn delete_secret_inner(
        &self,
        request: Request<pb::DeleteSecretRequest>,
    ) -> Result<pb::DeleteSecretResponse, AdminError> {
        let caller = self.writer(&request).await?;
        let peer = peer(&request);
        let req = request.into_inner();
        tenant_name(&req.tenant, "tenant")?;
        if !is_valid_secret_name(&req.name) {
            return Err(AdminError::InvalidName { field: "name" });
        }
        let stored = self.store.get_tenant(&req.tenant).await?;
        if let Some(tenant) = &stored
            && TenantSpec::parse(&tenant.spec, Some(&tenant.name))
                .is_ok_and(|s| s.stored_references().contains(&req.name))
        {
            return Err(AdminError::SecretInUse {
                tenant: req.tenant,
                name: req.name,
            });
        }
        let slot = self
            .audit_slot(attempt(
                &caller,
                &peer,
                "DeleteSecret",
                &req.tenant,
                Some(&req.name),
            ))
            .await?;
        let staged = self
            .store
            .stage_delete_secret(&req.tenant, &req.name)
            .await?;
        if !*staged.value() {
            return Err(AdminError::SecretNotFound {
                tenant: req.tenant,
                name: req.name,
            });
        }
        let version = stored.as_ref().map(|t| t.version);
        let change = AdminChange {
            rpc: "DeleteSecret",
            caller: caller_record(&caller),
            peer,
            tenant: &req.tenant,
            secret: Some(&req.name),
            old_version: version,
            new_version: version,
        };
        self.commit(slot, staged, change).await?;
        tracing::info!(tenant = %req.tenant, secret = %req.name, caller = %caller, "admin: secret deleted");
        Ok(pb::DeleteSecretResponse {})
    }

    async fn list_secrets_inner(
        &self,
        request: Request<pb::ListSecretsRequest>,
    ) -> Result<pb::ListSecretsResponse, AdminError> {
        self.caller(&request).await?;
        let tenant = request.into_inner().tenant;
        tenant_name(&tenant, "tenant")?;
        let secrets = self.store.list_secrets(&tenant).await?;
        Ok(pb::ListSecretsResponse {
            secrets: secrets
                .into_iter()
                .map(|s| pb::SecretInfo {
                    name: s.name,
                    version: s.version.to_string(),
                    updated_at_ms: s.updated_at_ms,
                })
                .collect(),
        })
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn put_tenant(
        &self,
        request: Request<pb::PutTenantRequest>,
    ) -> Result<Response<pb::Tenant>, Status> {
        let result = self.put_tenant_inner(request).await;
        self.finish("PutTenant", result)
    }

    async fn get_tenant(
        &self,
        request: Request<pb::GetTenantRequest>,
    ) -> Result<Response<pb::Tenant>, Status> {
        let result = self.get_tenant_inner(request).await;
        self.finish("GetTenant", result)
    }

    async fn delete_tenant(
        &self,
        request: Request<pb::DeleteTenantRequest>,
    ) -> Result<Response<pb::DeleteTenantResponse>, Status> {
        let result = self.delete_tenant_inner(request).await;
        self.finish("DeleteTenant", result)
    }

    async fn list_tenants(
        &self,
        request: Request<pb::ListTenantsRequest>,
    ) -> Result<Response<pb::ListTenantsResponse>, Status> {
        let result = self.list_tenants_inner(request).await;
        self.finish("ListTenants", result)
    }

    async fn put_secret(
        &self,
        request: Request<pb::PutSecretRequest>,
    ) -> Result<Response<pb::PutSecretResponse>, Status> {
        let result = self.put_secret_inner(request).await;
        self.finish("PutSecret", result)
    }

    async fn delete_secret(
        &self,
        request: Request<pb::DeleteSecretRequest>,
    ) -> Result<Response<pb::DeleteSecretResponse>, Status> {
        let result = self.delete_secret_inner(request).await;
        self.finish("DeleteSecret", result)
    }

    async fn list_secrets(
        &self,
        request: Request<pb::ListSecretsRequest>,
    ) -> Result<Response<pb::ListSecretsResponse>, Status> {
        let result = self.list_secrets_inner(request).await;
        self.finish("ListSecrets", result)
    }
}

fn tenant_name(name: &str, field: &'static str) -> Result<(), AdminError> {
    if is_valid_tenant_name(name) {
        Ok(())
    } else {
        Err(AdminError::InvalidName { field })
    }
}

/// An `expected_version`: empty is `None`; else a positive decimal.
fn expected_version(text: &str) -> Result<Option<i64>, AdminError> {
    if text.is_empty() {
        return Ok(None);
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(AdminError::InvalidVersion);
    }
    match text.parse::<i64>() {
        Ok(v) if v > 0 => Ok(Some(v)),
        _ => Err(AdminError::InvalidVersion),
    }
}

/// The error of a refused write of `name`, as the request expected it.
fn write_error(name: &str, expect: Expect, error: TenantWriteError) -> AdminError {
    match error {
        TenantWriteError::VersionMismatch { current: None } => AdminError::TenantNotFound {
            name: name.to_owned(),
        },
        TenantWriteError::VersionMismatch {
            current: Some(current),
        } => match expect {
            Expect::Version(expected) => AdminError::VersionMismatch {
                name: name.to_owned(),
                expected,
                current,
            },
            Expect::Absent | Expect::Any => AdminError::TenantExists {
                name: name.to_owned(),
                version: current,
            },
        },
        TenantWriteError::ApproverTokenTaken { index, tenant } => AdminError::ApproverTokenTaken {
            name: name.to_owned(),
            index,
            owner: tenant,
            origin: None,
        },
        TenantWriteError::TokenTaken { index, tenant } => AdminError::TokenTaken {
            name: name.to_owned(),
            index,
            owner: tenant,
            origin: TenantOrigin::Store { version: 0 },
        },
        TenantWriteError::State(e) => AdminError::Store(e),
    }
}

/// The record of a change about to be tried (its versions not known yet).
fn attempt<'a>(
    caller: &AdminCaller,
    peer: &Option<String>,
    rpc: &'a str,
    tenant: &'a str,
    secret: Option<&'a str>,
) -> AdminChange<'a> {
    AdminChange {
        rpc,
        caller: caller_record(caller),
        peer: peer.clone(),
        tenant,
        secret,
        old_version: None,
        new_version: None,
    }
}

fn caller_record(caller: &AdminCaller) -> CallerRecord {
    match caller {
        AdminCaller::Token { index } => CallerRecord::AdminToken {
            admin_token_index: *index,
        },
        AdminCaller::Jwt { issuer, subject } => CallerRecord::Jwt {
            issuer: issuer.clone(),
            subject: subject.clone(),
        },
    }
}

fn peer<T>(request: &Request<T>) -> Option<String> {
    request.remote_addr().map(|a| a.to_string())
}

fn to_pb(tenant: StoredTenant) -> pb::Tenant {
    pb::Tenant {
        name: tenant.name,
        version: tenant.version.to_string(),
        spec_yaml: tenant.spec,
    }
}

/// The opaque token of the page after `name`.
fn page_token(name: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{PAGE_TOKEN_PREFIX}{name}"))
}

fn read_page_token(token: &str) -> Result<String, AdminError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .and_then(|text| text.strip_prefix(PAGE_TOKEN_PREFIX).map(str::to_owned))
        .filter(|name| is_valid_tenant_name(name))
        .ok_or(AdminError::InvalidPageToken)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_positive_decimals() {
        assert_eq!(expected_version("").unwrap(), None);
        assert_eq!(expected_version("42").unwrap(), Some(42));
        for bad in ["0", "-1", "+1", "1.0", "x", " 1", "99999999999999999999"] {
            assert!(
                matches!(expected_version(bad), Err(AdminError::InvalidVersion)),
                "{bad}"
            );
        }
    }

    #[test]
    fn page_tokens_round_trip_and_others_are_refused() {
        assert_eq!(read_page_token(&page_token("acme-1")).unwrap(), "acme-1");
        for bad in [
            "",
            "acme",
            "djE6",
            "!!",
            &base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("v2:acme"),
        ] {
            assert!(read_page_token(bad).is_err(), "{bad}");
        }
    }
}
