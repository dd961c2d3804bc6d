-- toolgate state store, SQLite flavour. Keep identical to
-- migrations/postgres/0004_held_grants.sql except for the column types
-- (BLOB/INTEGER here, BYTEA/BIGINT there).

-- Consents whose code was exchanged, held until the tenant's application
-- confirms them for their subject (CompleteAuthorization), keyed by the
-- SHA-256 (hex) of the one-time code handed to the browser, so the table
-- never holds a live code. `sealed` holds the tokens and whose flow it was.
CREATE TABLE toolgate_held_grants (
    code_hash TEXT NOT NULL PRIMARY KEY,
    sealed BLOB NOT NULL,
    expires_at_ms INTEGER NOT NULL
);

CREATE INDEX toolgate_held_grants_expiry ON toolgate_held_grants (expires_at_ms);
