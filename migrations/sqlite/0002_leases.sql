-- toolgate state store, SQLite flavour. Keep identical to
-- migrations/postgres/0002_leases.sql except for the column types
-- (INTEGER here, BIGINT there).

-- Short leases between replicas: who refreshes a token now. `name` is
-- opaque (for tokens, a SHA-256 hex of the key, so no subject appears);
-- `holder` is a random per-process id; a lease whose `expires_at_ms` has
-- passed may be taken by anyone.
CREATE TABLE toolgate_leases (
    name TEXT NOT NULL PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at_ms INTEGER NOT NULL
);

-- The subjects holding a token for (tenant, server), oldest write first.
CREATE INDEX toolgate_tokens_by_server ON toolgate_tokens (tenant, server, updated_at_ms);
