//! Reading a server's lists to the end: `nextCursor` followed page by
//! page, bounded by `max_list_pages`, a cursor seen before refused (a
//! listing that would never end); tools and prompts.

use std::collections::HashSet;

use rmcp::model::{PaginatedRequestParams, Prompt, Tool};
use rmcp::service::{Peer, RoleClient};

use super::UpstreamError;
use crate::credentials::Redaction;

/// Follows `nextCursor` to the end, bounded by `max_pages` and refusing a
/// cursor seen before.
pub(super) async fn list_all_tools(
    peer: &Peer<RoleClient>,
    max_pages: u32,
    redaction: &Redaction,
) -> Result<Vec<Tool>, UpstreamError> {
    list_all(max_pages, |cursor| async move {
        let page = peer.list_tools(cursor_params(cursor)).await.map_err(|e| {
            // Already redacted and bounded by `from_service`.
            UpstreamError::ListTools(UpstreamError::from_service(e, redaction).to_string())
        })?;
        Ok((page.tools, page.next_cursor))
    })
    .await
    .map_err(|e| match e {
        Paging::Page(e) => e,
        Paging::TooManyPages(pages) => UpstreamError::TooManyPages(pages),
        Paging::RepeatedCursor => UpstreamError::RepeatedCursor,
    })
}

/// Every prompt of the server, all pages (bounded as tools are), or why
/// not, in words: a failure refuses the server's prompts only.
pub(super) async fn list_all_prompts(
    peer: &Peer<RoleClient>,
    max_pages: u32,
    redaction: &Redaction,
) -> Result<Vec<Prompt>, String> {
    list_all(max_pages, |cursor| async move {
        let page = peer
            .list_prompts(cursor_params(cursor))
            .await
            .map_err(|e| UpstreamError::from_service(e, redaction))?;
        Ok((page.prompts, page.next_cursor))
    })
    .await
    .map_err(|e| match e {
        Paging::Page(e) => format!("prompts/list failed: {e}"),
        Paging::TooManyPages(pages) => format!(
            "prompts/list returned more than {pages} pages (raise max_list_pages if this is real)"
        ),
        Paging::RepeatedCursor => {
            "prompts/list repeated the cursor of an earlier page; the listing would never end"
                .to_owned()
        }
    })
}

/// The request parameters of the page at `cursor` (the first: none).
fn cursor_params(cursor: Option<String>) -> Option<PaginatedRequestParams> {
    cursor.map(|c| PaginatedRequestParams::default().with_cursor(Some(c)))
}

/// Why a paged listing stopped.
pub(super) enum Paging {
    /// A page failed.
    Page(UpstreamError),
    /// More than `max_list_pages` pages.
    TooManyPages(u32),
    /// A cursor came twice.
    RepeatedCursor,
}

/// Follows `nextCursor` from the first page to the end: `page(cursor)`
/// fetches one page (its items and next cursor). At most `max_pages`
/// pages, and a cursor seen before ends the listing (it would never end).
pub(super) async fn list_all<T, F, Fut>(max_pages: u32, mut page: F) -> Result<Vec<T>, Paging>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<T>, Option<String>), UpstreamError>>,
{
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    let mut seen = HashSet::new();
    for _ in 0..max_pages {
        let (listed, next) = page(cursor.take()).await.map_err(Paging::Page)?;
        items.extend(listed);
        match next {
            None => return Ok(items),
            Some(next) => {
                if !seen.insert(next.clone()) {
                    return Err(Paging::RepeatedCursor);
                }
                cursor = Some(next);
            }
        }
    }
    Err(Paging::TooManyPages(max_pages))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listing whose pages are `pages` (items, next cursor), by cursor:
    /// the first page for no cursor, page `n` for cursor `"n"`.
    async fn listed(pages: &[(u32, Option<&str>)], max_pages: u32) -> Result<Vec<u32>, Paging> {
        list_all(max_pages, |cursor| {
            let index = cursor.map_or(0, |c| c.parse::<usize>().unwrap());
            let (item, next) = pages[index];
            async move { Ok((vec![item], next.map(str::to_owned))) }
        })
        .await
    }

    #[tokio::test]
    async fn pages_are_followed_to_the_end_within_bounds() {
        let pages = [(10, Some("1")), (11, Some("2")), (12, None)];
        assert_eq!(listed(&pages, 3).await.ok(), Some(vec![10, 11, 12]));
        assert!(matches!(
            listed(&pages, 2).await,
            Err(Paging::TooManyPages(2))
        ));
        // A cursor seen before would never end.
        let looping = [(10, Some("1")), (11, Some("2")), (12, Some("1"))];
        assert!(matches!(
            listed(&looping, 100).await,
            Err(Paging::RepeatedCursor)
        ));
        // A failing page fails the listing.
        let failed = list_all::<u32, _, _>(5, |_| async {
            Err(UpstreamError::Protocol("boom".to_owned()))
        })
        .await;
        assert!(matches!(
            failed,
            Err(Paging::Page(UpstreamError::Protocol(_)))
        ));
    }
}
