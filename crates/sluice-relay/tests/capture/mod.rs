//! The log lines a test causes, captured at INFO and above for assertions. The subscriber is
//! this thread's default only, so a `current_thread` test sees its own relays' lines alone.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use tracing::subscriber::DefaultGuard;

/// What was logged on this thread since [`Logs::start`], until it is dropped.
pub struct Logs {
    text: Arc<Mutex<Vec<u8>>>,
    _guard: DefaultGuard,
}

impl Logs {
    /// Captures this thread's log lines from now on.
    pub fn start() -> Self {
        let text = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&text);
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || Sink(Arc::clone(&sink)))
            .finish();
        let guard = tracing::subscriber::set_default(subscriber);
        // Callsites met on other threads with no subscriber may be cached as unwanted.
        tracing::callsite::rebuild_interest_cache();
        Self {
            text,
            _guard: guard,
        }
    }

    /// The captured lines that contain every one of `parts`.
    pub fn lines_with(&self, parts: &[&str]) -> Vec<String> {
        let all = String::from_utf8_lossy(&self.text.lock().unwrap()).into_owned();
        all.lines()
            .filter(|l| parts.iter().all(|p| l.contains(p)))
            .map(str::to_owned)
            .collect()
    }
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
