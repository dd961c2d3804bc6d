//! A session's resource list (resources and templates), read through and
//! kept while fresh: `ttlMs` where the server gives one, until
//! `list_changed` where it declared it, bounded in entries and bytes.
//! Reads of resources are never cached.

/// The resource list of one session, as last read.
#[derive(Debug, Default)]
pub(crate) struct ListingCache {}
