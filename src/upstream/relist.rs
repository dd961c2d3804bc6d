//! Reading a live session's tool and prompt lists again when the server
//! says they changed (`notifications/{tools,prompts}/list_changed`): the
//! same paging and bounds as at connect. On 2026-07-28 sessions those
//! notifications come only on a `subscriptions/listen` stream, which
//! [`Session::follow_list_changes`] opens and feeds into
//! [`Session::events`].

use std::time::Duration;

use rmcp::model::{Prompt, ServerNotification, SubscriptionFilter, Tool};

use super::events::ListKind;
use super::listing::{list_all_prompts, list_all_tools};
use super::{Session, UpstreamError};

/// How long a `subscriptions/listen` that ended is left before it is
/// opened again (at most; doubled from 1 s at each failure in a row).
const MAX_LISTEN_BACKOFF: Duration = Duration::from_secs(60);

impl Session {
    /// Every tool of the server, all pages, as at connect (at most
    /// `max_pages` pages, within `timeout`).
    ///
    /// # Errors
    /// The listing fails, never ends, or outlasts `timeout`.
    pub async fn list_tools(
        &self,
        max_pages: u32,
        timeout: Duration,
    ) -> Result<Vec<Tool>, UpstreamError> {
        if let Some(bearer) = &self.bearer {
            bearer.refresh().await?;
        }
        tokio::time::timeout(timeout, async {
            let live = self.hold().await?;
            list_all_tools(&live, max_pages, &self.redaction).await
        })
        .await
        .map_err(|_| UpstreamError::Timeout(timeout))?
    }

    /// Every prompt of the server, all pages, as at connect; `None` when
    /// the server does not offer prompts, `Err` saying why its prompts are
    /// refused.
    pub async fn list_prompts(
        &self,
        max_pages: u32,
        timeout: Duration,
    ) -> Option<Result<Vec<Prompt>, String>> {
        self.server_capabilities().prompts.as_ref()?;
        if let Some(bearer) = &self.bearer
            && let Err(e) = bearer.refresh().await
        {
            return Some(Err(format!("prompts/list failed: {e}")));
        }
        Some(
            tokio::time::timeout(timeout, async {
                let live = self
                    .hold()
                    .await
                    .map_err(|e| format!("prompts/list failed: {e}"))?;
                list_all_prompts(&live, max_pages, &self.redaction).await
            })
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "prompts/list did not end within {}",
                    humantime::format_duration(timeout)
                ))
            }),
        )
    }

    /// Which lists (tools, prompts) the server says it announces changes
    /// of (`listChanged`).
    pub fn announces_list_changes(&self) -> (bool, bool) {
        let capabilities = self.server_capabilities();
        (
            capabilities
                .tools
                .as_ref()
                .is_some_and(|t| t.list_changed == Some(true)),
            capabilities
                .prompts
                .as_ref()
                .is_some_and(|p| p.list_changed == Some(true)),
        )
    }

    /// On a 2026-07-28 session whose server announces tool or prompt list
    /// changes: keeps one `subscriptions/listen` open for them, feeding
    /// what it receives into [`Session::events`], and opens it again
    /// (with a backoff) when it ends, until the session ends. Returns at
    /// once otherwise (older sessions get the notifications through the
    /// handler).
    pub async fn follow_list_changes(&self) {
        let (tools, prompts) = self.announces_list_changes();
        // A server offering skills that announces resource list changes:
        // those relist its skills (their files are resources).
        let capabilities = self.server_capabilities();
        let skills = super::skills::offers_skills(&capabilities, self.is_stateless())
            && capabilities
                .resources
                .as_ref()
                .is_some_and(|r| r.list_changed == Some(true));
        if !self.is_stateless() || !(tools || prompts || skills) {
            return;
        }
        let mut filter = SubscriptionFilter::new();
        filter.tools_list_changed = tools.then_some(true);
        filter.prompts_list_changed = prompts.then_some(true);
        filter.resources_list_changed = skills.then_some(true);
        let mut backoff = Duration::from_secs(1);
        let mut reopened = false;
        while !self.is_ended() {
            // Held while the stream is open: a stateless session's
            // service stays open with it.
            let live = match self.hold().await {
                Ok(live) => live,
                Err(error) => {
                    tracing::debug!(
                        tenant = %self.label.tenant,
                        server = %self.label.server,
                        %error,
                        "subscriptions/listen for list changes: no service"
                    );
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = self.wait_ended() => return,
                    }
                    backoff = (backoff * 2).min(MAX_LISTEN_BACKOFF);
                    continue;
                }
            };
            match live.listen(filter.clone()).await {
                Ok(mut subscription) => {
                    // Opened again: what changed while none was open is
                    // read again.
                    if std::mem::replace(&mut reopened, true) {
                        self.events().list_changed(ListKind::Tools);
                        self.events().list_changed(ListKind::Prompts);
                        self.events().list_changed(ListKind::Skills);
                    }
                    backoff = Duration::from_secs(1);
                    while let Ok(Some(notification)) = subscription.next().await {
                        match notification {
                            ServerNotification::ToolListChangedNotification(_) => {
                                self.events().list_changed(ListKind::Tools);
                            }
                            ServerNotification::PromptListChangedNotification(_) => {
                                self.events().list_changed(ListKind::Prompts);
                            }
                            ServerNotification::ResourceListChangedNotification(_) => {
                                self.events().list_changed(ListKind::Skills);
                            }
                            _ => {}
                        }
                    }
                }
                Err(error) => {
                    tracing::debug!(
                        tenant = %self.label.tenant,
                        server = %self.label.server,
                        error = %UpstreamError::from_service(error, &self.redaction),
                        "subscriptions/listen for list changes failed"
                    );
                }
            }
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = self.wait_ended() => return,
            }
            backoff = (backoff * 2).min(MAX_LISTEN_BACKOFF);
        }
    }
}
