//! Graceful shutdown: one trigger, many listeners of it.

use std::future::Future;

use tokio::sync::watch;

/// Triggers shutdown for every [`ShutdownSignal`] made from it. Dropping it also triggers.
#[derive(Debug)]
pub struct Shutdown {
    tx: watch::Sender<bool>,
}

/// Resolves when shutdown has been triggered. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ShutdownSignal {
    rx: watch::Receiver<bool>,
}

impl Shutdown {
    /// A new, untriggered shutdown.
    pub fn new() -> Self {
        Self {
            tx: watch::channel(false).0,
        }
    }

    /// A signal that resolves once [`Shutdown::trigger`] is called.
    pub fn signal(&self) -> ShutdownSignal {
        ShutdownSignal {
            rx: self.tx.subscribe(),
        }
    }

    /// Starts the shutdown of everything holding a signal.
    pub fn trigger(&self) {
        self.tx.send_replace(true);
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
        let mut rx = self.rx.clone();
        async move {
            // An error means the trigger is gone, which also means: shut down.
            let _ = rx.wait_for(|triggered| *triggered).await;
        }
    }

    /// Whether shutdown has been triggered.
    pub fn is_triggered(&self) -> bool {
        *self.rx.borrow()
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
