-- toolgate state store, PostgreSQL flavour. Keep identical to
-- migrations/sqlite/0007_used_request_states.sql except for the column types
-- (BIGINT here, INTEGER there).

-- Rounds of questions already answered: the SHA-256 (hex) of the nonce
-- sealed in each answered request_state, kept until that state would have
-- expired, so that one round's answers are used once, on any replica (the
-- insert that finds the row present is a second use).
CREATE TABLE toolgate_used_states (
    nonce_hash TEXT NOT NULL PRIMARY KEY,
    expires_at_ms BIGINT NOT NULL
);

CREATE INDEX toolgate_used_states_expiry ON toolgate_used_states (expires_at_ms);
