//! Which streams the connection's task was woken for, so that it works on those and not on
//! every stream it has: an answer body that has a frame (each body is polled with a waker of
//! its own stream), a request body whose reads made a window update due.

use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Wake, Waker};

/// Shared by a connection and the wakers of its streams.
#[derive(Debug, Default)]
pub(super) struct Wakes(Mutex<Woken>);

#[derive(Debug, Default)]
struct Woken {
    /// Streams whose answer body may have a frame (or room to send one), in the order woken.
    bodies: Vec<u32>,
    /// Streams whose request body was read enough to credit the client.
    credits: Vec<u32>,
    /// The connection's task.
    conn: Option<Waker>,
}

impl Wakes {
    fn lock(&self) -> MutexGuard<'_, Woken> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The connection's task is the one `waker` wakes.
    pub(super) fn register(&self, waker: &Waker) {
        let mut woken = self.lock();
        if !woken.conn.as_ref().is_some_and(|w| w.will_wake(waker)) {
            woken.conn = Some(waker.clone());
        }
    }

    /// Stream `id`'s answer body is to be polled, by the connection's task, which is running
    /// (no wake-up).
    pub(super) fn mark(&self, id: u32) {
        self.lock().bodies.push(id);
    }

    /// The streams to poll the bodies of (taken: each is polled once per mark).
    pub(super) fn take_bodies(&self) -> Vec<u32> {
        std::mem::take(&mut self.lock().bodies)
    }

    /// Stream `id`'s request body was read: a credit is due, the connection is woken.
    pub(super) fn credit(&self, id: u32) {
        let mut woken = self.lock();
        woken.credits.push(id);
        if let Some(conn) = &woken.conn {
            conn.wake_by_ref();
        }
    }

    /// The streams whose credits are due.
    pub(super) fn take_credits(&self) -> Vec<u32> {
        std::mem::take(&mut self.lock().credits)
    }

    /// The waker a stream's answer body is polled with: it wakes the connection for that
    /// stream alone.
    pub(super) fn body_waker(self: &Arc<Self>, id: u32) -> Waker {
        Waker::from(Arc::new(BodyWaker {
            id,
            wakes: Arc::clone(self),
        }))
    }

    fn wake_body(&self, id: u32) {
        let mut woken = self.lock();
        woken.bodies.push(id);
        if let Some(conn) = &woken.conn {
            conn.wake_by_ref();
        }
    }
}

struct BodyWaker {
    id: u32,
    wakes: Arc<Wakes>,
}

impl Wake for BodyWaker {
    fn wake(self: Arc<Self>) {
        self.wakes.wake_body(self.id);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.wake_body(self.id);
    }
}
