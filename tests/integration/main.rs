//! Integration tests: one binary, sharing `common`. Each module drives the
//! gateway end to end, in process on port 0 or as the real binary.

#[path = "../common/mod.rs"]
mod common;

mod admin;
mod approvals;
mod architecture;
mod audit;
mod audit_chain;
mod auth;
mod binary;
mod catalog;
mod cli_input;
mod cli_offerings;
mod cli_tls;
mod complete;
mod consent;
mod docs;
mod fixtures;
mod fuzz_corpus;
mod guards;
mod hostile;
mod input_interactive;
mod input_unary;
mod invoke;
mod jwt;
mod lazy;
mod limits;
mod listener_tls;
mod mtls_callers;
mod oauth;
mod oauth_oidc;
mod oauth_redaction;
mod onboarding;
mod ops;
mod policy;
mod policy_targets;
mod processes;
mod prompts;
mod redaction;
mod reload;
mod resources;
mod routing;
mod search;
mod sessions;
mod state;
mod state_tenants;
mod subject_limits;
mod subjects;
mod tasks;
mod tenant_store;
mod tenants_dir;
mod third_party;
mod tls;
mod watch_resource;
mod worker_api;
