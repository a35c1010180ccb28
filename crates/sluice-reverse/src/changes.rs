//! [`Changes`]: wakes whoever waits for a cluster's sessions, idle rings or queues to change,
//! and costs nothing when nobody does.
//!
//! Every session leased and returned changes an idle ring, so the proxy signals a change twice
//! per request; a `Notify` takes its waiter list's lock for each signal even with nobody on the
//! list. Waits here are counted instead (a drain waiting for its sessions, a handoff pump), and
//! a change with none counted skips the `Notify`. Where a handoff runs, its pumps wait all the
//! time, and each change still signals.

use std::sync::atomic::{fence, AtomicUsize, Ordering};

use tokio::sync::Notify;

/// Change signals of one cluster: what its pools and instances tell its waits.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    notify: Notify,
    /// Waits under way. A wait is counted before it looks at what it waits for.
    waiting: AtomicUsize,
}

/// A wait, counted while it lasts.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(waiting: &'a AtomicUsize) -> Self {
        waiting.fetch_add(1, Ordering::Relaxed);
        Self(waiting)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Changes {
    /// Signals a change (made before this call) to every wait under way.
    pub(crate) fn notify(&self) {
        // With the fence in the waits: either this load sees a wait counted, or that wait's
        // look at the state comes after this fence and sees the change.
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::Relaxed) > 0 {
            self.notify.notify_waiters();
        }
    }

    /// Resolves once `done` holds, checking it again at every change.
    pub(crate) async fn wait_until(&self, done: impl Fn() -> bool) {
        let _counted = Counted::new(&self.waiting);
        fence(Ordering::SeqCst);
        loop {
            let changed = self.notify.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if done() {
                return;
            }
            changed.await;
        }
    }

    /// Resolves at the next change signalled after this is first polled.
    pub(crate) async fn next(&self) {
        let _counted = Counted::new(&self.waiting);
        fence(Ordering::SeqCst);
        self.notify.notified().await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::future::Future;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::task::Poll;
    use std::time::Duration;

    use super::*;

    /// Waits until a wait is counted (the task making it has run up to its `Notify`).
    async fn counted(changes: &Changes, n: usize) {
        while changes.waiting.load(Ordering::Relaxed) != n {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_wait_sees_a_change_signalled_while_it_waits() {
        let changes = Arc::new(Changes::default());
        let flag = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (changes, flag) = (Arc::clone(&changes), Arc::clone(&flag));
            tokio::spawn(async move {
                changes.wait_until(|| flag.load(Ordering::Relaxed)).await;
            })
        };
        counted(&changes, 1).await;
        flag.store(true, Ordering::Relaxed);
        changes.notify();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the wait missed the change")
            .unwrap();
        assert_eq!(
            changes.waiting.load(Ordering::Relaxed),
            0,
            "the wait is no longer counted"
        );
    }

    #[tokio::test]
    async fn next_resolves_at_the_next_change() {
        let changes = Arc::new(Changes::default());
        let next = {
            let changes = Arc::clone(&changes);
            tokio::spawn(async move { changes.next().await })
        };
        counted(&changes, 1).await;
        changes.notify();
        tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .expect("next missed the change")
            .unwrap();
        assert_eq!(changes.waiting.load(Ordering::Relaxed), 0);
    }

    /// A wait given up while pending (a `select!` taking another branch) is no longer counted,
    /// so changes after it skip the `Notify` again.
    #[tokio::test]
    async fn a_wait_dropped_while_pending_is_no_longer_counted() {
        let changes = Changes::default();
        let mut next = Box::pin(changes.next());
        let polled = std::future::poll_fn(|cx| Poll::Ready(next.as_mut().poll(cx).is_pending()));
        assert!(polled.await, "nothing changed yet");
        assert_eq!(changes.waiting.load(Ordering::Relaxed), 1);
        drop(next);
        assert_eq!(changes.waiting.load(Ordering::Relaxed), 0);
    }
}
