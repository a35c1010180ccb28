//! What a test binary logs at warn and above, captured for assertions on log lines. Tests in
//! one binary share it (one global subscriber), so each looks for lines only it can cause.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::sync::{Arc, Mutex, OnceLock};

/// The captured log; installs the subscriber on first use.
pub fn captured_logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    Arc::clone(LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&logs);
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || Sink(Arc::clone(&sink)))
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        logs
    }))
}

/// The captured lines that contain `text`.
pub fn lines_with(logs: &Mutex<Vec<u8>>, text: &str) -> Vec<String> {
    let all = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    all.lines()
        .filter(|l| l.contains(text))
        .map(str::to_owned)
        .collect()
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
