-- toolgate state store, SQLite flavour. Keep identical to
-- migrations/postgres/0003_token_seal_binds_version.sql.

-- A token's sealed value is bound to the row's version as well as to its key
-- (src/state/keys.rs, TokenKey::aad), so that a value put back from an older
-- version of the row no longer opens. The column is renamed so that a gateway
-- of an earlier release still running during an upgrade fails on token rows
-- (STATE_UNAVAILABLE) instead of writing values this release cannot open.
-- The rows present now were sealed without their version: the gateway
-- re-seals each for its version in the same transaction as this migration
-- (src/state/migrate.rs), so none is left in the old format and no code path
-- reads that format.
ALTER TABLE toolgate_tokens RENAME COLUMN sealed TO sealed_with_version;
