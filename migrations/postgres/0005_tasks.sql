-- toolgate state store, PostgreSQL flavour. Keep identical to
-- migrations/sqlite/0005_tasks.sql except for the column types
-- (BYTEA/BIGINT here, BLOB/INTEGER there).

-- Tasks (SEP-2663) that calls with accepts_task became, keyed by the
-- SHA-256 (hex) of the task id toolgate handed to the worker, so the table
-- never holds a live id. `sealed` holds whose task it is (subject), its
-- server, tool and upstream task id, and the status last seen; it is bound
-- to the task id and the tenant. Rows are purged once expired.
CREATE TABLE toolgate_tasks (
    task_hash TEXT NOT NULL PRIMARY KEY,
    tenant TEXT NOT NULL,
    sealed BYTEA NOT NULL,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL
);

CREATE INDEX toolgate_tasks_tenant_expiry ON toolgate_tasks (tenant, expires_at_ms);
CREATE INDEX toolgate_tasks_expiry ON toolgate_tasks (expires_at_ms);
