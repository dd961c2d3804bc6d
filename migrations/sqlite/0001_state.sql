-- toolgate state store, SQLite flavour. Keep identical to
-- migrations/postgres/0001_state.sql except for the column types
-- (BLOB/INTEGER here, BYTEA/BIGINT there).

-- Upstream OAuth tokens per (tenant, subject, server). `subject` is '' for the
-- tenant itself. `sealed` is AES-256-GCM ciphertext (see src/state/keyring.rs);
-- `version` grows by one on every write, for compare-and-swap refreshes.
CREATE TABLE toolgate_tokens (
    tenant TEXT NOT NULL,
    subject TEXT NOT NULL,
    server TEXT NOT NULL,
    version INTEGER NOT NULL,
    sealed BLOB NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (tenant, subject, server)
);

-- OAuth client registrations (dynamic registration results) per
-- (tenant, server, issuer); sealed because they may hold a client secret.
CREATE TABLE toolgate_oauth_clients (
    tenant TEXT NOT NULL,
    server TEXT NOT NULL,
    issuer TEXT NOT NULL,
    sealed BLOB NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (tenant, server, issuer)
);

-- Pending authorization flows, keyed by the SHA-256 (hex) of the opaque
-- `state` parameter, so the table never holds a live `state` value.
CREATE TABLE toolgate_pending_flows (
    state_hash TEXT NOT NULL PRIMARY KEY,
    sealed BLOB NOT NULL,
    expires_at_ms INTEGER NOT NULL
);

CREATE INDEX toolgate_pending_flows_expiry ON toolgate_pending_flows (expires_at_ms);
