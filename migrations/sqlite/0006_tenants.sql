-- toolgate state store, SQLite flavour. Keep identical to
-- migrations/postgres/0006_tenants.sql except for the column types
-- (BLOB/INTEGER here, BYTEA/BIGINT there) and how `seq` is generated
-- (AUTOINCREMENT here, an identity column there: neither reuses a number,
-- not even after the newest rows are deleted).

-- Tenants written through the admin API (src/state/tenants.rs). `sealed`
-- holds the spec as written, bound to the tenant's name and version;
-- `version` is the `seq` of the change that wrote it, so it is never
-- reused, not even after a delete and a create.
CREATE TABLE toolgate_tenants (
    name TEXT NOT NULL PRIMARY KEY,
    version INTEGER NOT NULL,
    sealed BLOB NOT NULL,
    updated_at_ms INTEGER NOT NULL
);

-- The index of the tenants' static tokens: the SHA-256 of a token (never
-- the token) → its tenant and its index in the spec's `tokens`. The digest
-- is the key, so one token never selects two tenants.
CREATE TABLE toolgate_tenant_tokens (
    digest BLOB NOT NULL PRIMARY KEY,
    tenant TEXT NOT NULL,
    token_index INTEGER NOT NULL
);

CREATE INDEX toolgate_tenant_tokens_tenant ON toolgate_tenant_tokens (tenant);

-- The secrets a tenant's spec reads as `{stored: NAME}`. `sealed` is bound
-- to the tenant and the name; `version` grows by one at every write.
CREATE TABLE toolgate_tenant_secrets (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    sealed BLOB NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (tenant, name)
);

-- The log of changes every replica follows: `kind` is `put` (a PutTenant),
-- `secret` (a PutSecret of an existing tenant: it is loaded again) or
-- `delete`. A tenant's version after a `put` or a `secret` is the change's
-- `seq`; after a `delete` it has none. Pruned by age, the newest change
-- always kept.
CREATE TABLE toolgate_tenant_changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    kind TEXT NOT NULL,
    at_ms INTEGER NOT NULL
);

CREATE INDEX toolgate_tenant_changes_at ON toolgate_tenant_changes (at_ms);
