//! Graceful shutdown: one trigger, many listeners of it.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// Triggers shutdown for every [`ShutdownSignal`] made from it. Dropping it also triggers.
#[derive(Debug)]
pub struct Shutdown {
    shared: Arc<Shared>,
}

/// Resolves when shutdown has been triggered. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ShutdownSignal {
    shared: Arc<Shared>,
}

/// A flag and who waits for it. Every idle client connection waits for it, so a wait is kept
/// small: a `Notify`'s waiter, not a `watch` receiver's (about half the bytes).
#[derive(Debug, Default)]
struct Shared {
    triggered: AtomicBool,
    waiters: Notify,
}

impl Shutdown {
    /// A new, untriggered shutdown.
    pub fn new() -> Self {
        Self {
            shared: Arc::default(),
        }
    }

    /// A signal that resolves once [`Shutdown::trigger`] is called.
    pub fn signal(&self) -> ShutdownSignal {
        ShutdownSignal {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Starts the shutdown of everything holding a signal.
    pub fn trigger(&self) {
        self.shared.triggered.store(true, Ordering::Release);
        self.shared.waiters.notify_waiters();
    }
}

impl Drop for Shutdown {
    fn drop(&mut self) {
        self.trigger();
    }
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl ShutdownSignal {
    /// Waits until shutdown is triggered (or its trigger dropped).
    pub fn wait(&self) -> impl Future<Output = ()> + Send + 'static {
        let shared = Arc::clone(&self.shared);
        async move {
            // A waiter hears every trigger from the moment it is made, so one that comes
            // between this and the check below is not missed.
            let triggered = shared.waiters.notified();
            if !shared.triggered.load(Ordering::Acquire) {
                triggered.await;
            }
        }
    }

    /// Whether shutdown has been triggered (or its trigger dropped).
    pub fn is_triggered(&self) -> bool {
        self.shared.triggered.load(Ordering::Acquire)
    }
}

/// Resolves on SIGINT or SIGTERM (Ctrl-C only, off Unix).
///
/// The handlers are installed when this is called, not when the future is first polled, so a
/// signal that arrives while servers are still starting is not lost (nor fatal to the process).
/// Call it inside a Tokio runtime.
pub fn os_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let handlers = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        );
        async move {
            match handlers {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait already waiting ends at the trigger, and one made after ends at once.
    #[tokio::test]
    async fn every_wait_ends_at_the_trigger_and_after_it() {
        let shutdown = Shutdown::new();
        let signal = shutdown.signal();
        let mut waiting = std::pin::pin!(signal.wait());
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        assert!(!signal.is_triggered());
        shutdown.trigger();
        waiting.await;
        signal.wait().await;
        assert!(signal.is_triggered());
    }

    #[tokio::test]
    async fn dropping_the_trigger_triggers() {
        let shutdown = Shutdown::new();
        let signal = shutdown.signal();
        let waiting = tokio::spawn(signal.wait());
        drop(shutdown);
        waiting.await.unwrap_or_else(|e| panic!("{e}"));
        assert!(signal.is_triggered());
    }
}
