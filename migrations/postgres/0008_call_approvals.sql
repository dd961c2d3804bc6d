-- toolgate state store, PostgreSQL flavour. Keep identical to
-- migrations/sqlite/0008_call_approvals.sql except for the column types
-- (BYTEA/BIGINT here, BLOB/INTEGER there).

-- Call approvals: a tool call that a policy rule with `require_approval`
-- held, waiting for a person's decision, and what was decided. `binding`
-- is the SHA-256 (hex) of everything the approval is bound to (tenant,
-- subject, exposed name, server, definition hash, canonical arguments'
-- digest, the rule and its digest): a call spends an approval only when
-- its own binding is the same. `state` is pending, approved, denied,
-- spent or expired; `expires_at_ms` is when a pending one expires
-- undecided, or an approved one unused. `sealed` holds what the approver
-- is shown (the tool, the redacted arguments, the rule) and the decision
-- (by whom, why), bound to the id and the tenant. `changed_at_ms` orders
-- the changes that watchers follow. Rows are deleted a week after they
-- end.
CREATE TABLE toolgate_call_approvals (
    id TEXT NOT NULL PRIMARY KEY,
    tenant TEXT NOT NULL,
    subject TEXT NOT NULL,
    binding TEXT NOT NULL,
    state TEXT NOT NULL,
    uses_left BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL,
    decided_at_ms BIGINT NOT NULL,
    changed_at_ms BIGINT NOT NULL,
    sealed BYTEA NOT NULL
);

CREATE INDEX toolgate_call_approvals_tenant ON toolgate_call_approvals (tenant, state, created_at_ms);
CREATE INDEX toolgate_call_approvals_binding ON toolgate_call_approvals (tenant, binding);
CREATE INDEX toolgate_call_approvals_changed ON toolgate_call_approvals (tenant, changed_at_ms);
CREATE INDEX toolgate_call_approvals_expiry ON toolgate_call_approvals (state, expires_at_ms);
