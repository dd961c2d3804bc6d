-- toolgate state store, SQLite flavour. Keep identical to
-- migrations/postgres/0009_idempotency_keys.sql except for the column types
-- (BLOB/INTEGER here, BYTEA/BIGINT there).

-- Idempotency keys of tool calls: keyed by the SHA-256 (hex) of the
-- tenant, subject, exposed tool name and the worker's key (the table never
-- holds a key). A row is written "in_flight" with the digest of the call's
-- canonical arguments before anything is sent; its call's end makes it
-- "done" (with the response, sealed to the row, when it fits) or
-- "in_doubt". An in-flight row whose gateway never finished it is in doubt
-- once in_flight_until_ms has passed. Rows are purged once expired.
CREATE TABLE toolgate_idempotency_keys (
    key_hash TEXT NOT NULL PRIMARY KEY,
    tenant TEXT NOT NULL,
    arguments_sha256 TEXT NOT NULL,
    state TEXT NOT NULL,
    call_id TEXT NOT NULL,
    in_flight_until_ms INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    sealed BLOB
);

CREATE INDEX toolgate_idempotency_keys_tenant ON toolgate_idempotency_keys (tenant, expires_at_ms);
CREATE INDEX toolgate_idempotency_keys_expiry ON toolgate_idempotency_keys (expires_at_ms);
