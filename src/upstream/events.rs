//! What a server tells a session about its lists and resources, for the
//! parts of the gateway that follow them: `notifications/*/list_changed`
//! bump a generation per list (the resource listing cache, prompt and tool
//! re-listing watch it), and `notifications/resources/updated` is
//! broadcast by URI (`WatchResource` subscribers filter it). On
//! 2026-07-28 sessions these arrive only on a `subscriptions/listen`
//! stream that asked for them; whoever opens one feeds what it receives
//! here too.

use tokio::sync::{broadcast, watch};

/// How many `resources/updated` a slow watcher may fall behind before it
/// misses some (it is then told it lagged: an update only says "changed",
/// so one notice stands for many).
const UPDATES: usize = 64;

/// One session's list generations and resource updates.
#[derive(Debug)]
pub struct SessionEvents {
    tools: watch::Sender<u64>,
    prompts: watch::Sender<u64>,
    resources: watch::Sender<u64>,
    skills: watch::Sender<u64>,
    /// Made by the first watcher: its buffer ([`UPDATES`] slots, about
    /// 3 KiB) is not held by the many sessions nobody watches.
    updated: std::sync::OnceLock<broadcast::Sender<String>>,
    /// The session's resource subscriptions, by URI (`WatchResource`).
    subscriptions: super::watchers::Subscriptions,
}

impl Default for SessionEvents {
    fn default() -> Self {
        Self {
            tools: watch::Sender::new(0),
            prompts: watch::Sender::new(0),
            resources: watch::Sender::new(0),
            skills: watch::Sender::new(0),
            updated: std::sync::OnceLock::new(),
            subscriptions: super::watchers::Subscriptions::default(),
        }
    }
}

/// Which list changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    /// `tools/list`.
    Tools,
    /// `prompts/list`.
    Prompts,
    /// `resources/list` and `resources/templates/list`.
    Resources,
    /// `skills/list` (the specification defines no notification of its
    /// own: toolgate bumps it when `skills/get` answers an entry that
    /// differs from the listed one; resource list changes relist skills
    /// too).
    Skills,
}

impl SessionEvents {
    fn sender(&self, kind: ListKind) -> &watch::Sender<u64> {
        match kind {
            ListKind::Tools => &self.tools,
            ListKind::Prompts => &self.prompts,
            ListKind::Resources => &self.resources,
            ListKind::Skills => &self.skills,
        }
    }

    /// The server said list `kind` changed.
    pub fn list_changed(&self, kind: ListKind) {
        self.sender(kind).send_modify(|generation| *generation += 1);
    }

    /// The generation of list `kind` (bumped at each change), to watch.
    pub fn list_generation(&self, kind: ListKind) -> watch::Receiver<u64> {
        self.sender(kind).subscribe()
    }

    /// The server said resource `uri` changed.
    pub fn resource_updated(&self, uri: String) {
        // No channel or no receiver: nobody watches; nothing to do.
        if let Some(updated) = self.updated.get() {
            let _ = updated.send(uri);
        }
    }

    /// The session's resource subscriptions.
    pub(super) fn subscriptions(&self) -> &super::watchers::Subscriptions {
        &self.subscriptions
    }

    /// Every `resources/updated` from now on.
    pub fn resource_updates(&self) -> broadcast::Receiver<String> {
        self.updated
            .get_or_init(|| broadcast::Sender::new(UPDATES))
            .subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_need_a_watcher_and_reach_it() {
        let events = SessionEvents::default();
        // Nobody watches: no buffer is made, and an update goes nowhere.
        events.resource_updated("a://1".to_owned());
        assert!(events.updated.get().is_none());
        let mut updates = events.resource_updates();
        assert!(events.updated.get().is_some());
        events.resource_updated("a://2".to_owned());
        assert_eq!(updates.try_recv().unwrap(), "a://2");
        assert!(updates.try_recv().is_err());
    }
}
