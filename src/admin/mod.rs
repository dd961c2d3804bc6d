//! The admin API (`toolgate.admin.v1.Admin`, `proto/toolgate/admin/v1/`):
//! tenants and their secrets in the state store, on its own listener
//! (`admin.listen`). Its callers are `admin.tokens` or JWTs of a
//! `callers.jwt` issuer whose `admin` expression holds; every change is an
//! audit record. See docs/admin.md.

/// Generated server code for `toolgate.admin.v1` (see `build.rs`).
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
pub mod server {
    include!(concat!(env!("OUT_DIR"), "/server/toolgate.admin.v1.rs"));
}

mod auth;
mod service;
mod status;

pub use auth::{AdminCaller, authenticate};
pub use service::{
    AdminService, ConfigInForce, DEFAULT_PAGE_SIZE, Followed, MAX_PAGE_SIZE, MAX_SECRET_BYTES,
};
pub use status::{AdminError, classify};
