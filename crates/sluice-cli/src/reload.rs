//! Reload (`POST /reload` on the admin API, or SIGHUP). The file is read first: one that does
//! not load changes nothing, and its `file:line:col` error is the answer. When only routes and
//! static endpoints changed, they change inside this process ([`sluice::reload`]): client
//! connections and sessions carry on. Otherwise it is a hot restart of the same binary with the
//! same file: the new process takes the listening sockets and idle sessions
//! (docs/handoff.md), and this one drains and exits, so no request fails, as with NGINX's
//! reload (whose new workers also start with fresh client connections).
//!
//! The new process is started as a child of this one and outlives it. Under systemd
//! (`Type=notify`, `NotifyAccess=all`: `deploy/systemd/`) the unit follows it: this process says
//! `RELOADING=1`, then `READY=1` itself when the reload was applied in place or refused, while
//! after a hot restart the successor says `MAINPID=` and `READY=1` ([`crate::notify`]).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice::{Applied, InPlace, ReloadHook};
use tokio::process::Command;
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::notify;

/// How long a successor may take to load its file and take over.
const TAKE_OVER_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start a successor of this process.
#[derive(Debug, Clone)]
pub(crate) struct Successor {
    pub(crate) config: PathBuf,
    pub(crate) workers: Option<usize>,
    pub(crate) log_format: &'static str,
    /// What may change without a new process.
    pub(crate) in_place: InPlace,
    /// The PID of the successor started last, while it may still take over (0: none).
    pub(crate) started: Arc<AtomicU32>,
    /// Set while a reload runs: a SIGHUP and a `POST /reload` at once must not start two
    /// successors (the old process would announce only one of them to systemd).
    pub(crate) busy: Arc<AtomicBool>,
}

/// Clears a reload's `busy` flag when the reload ends, however it ends.
struct Busy(Arc<AtomicBool>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// How a reload went through.
enum Reloaded {
    /// Applied inside this process, which goes on.
    InPlace(String),
    /// A new process took over; this one drains and exits.
    Restarted(String),
}

impl Successor {
    /// The reload hook: resolves once a successor has taken over (`upgraded` turns true).
    /// Every reload, by SIGHUP or `POST /reload`, leaves a line saying what it did.
    pub(crate) fn hook(self, upgraded: watch::Receiver<bool>) -> ReloadHook {
        ReloadHook::new(move || {
            let (this, upgraded) = (self.clone(), upgraded.clone());
            Box::pin(async move {
                let draining = *upgraded.borrow();
                if draining {
                    // Not the service's main process any more: it tells systemd nothing.
                    let reason = "a reload is already under way: this process is draining";
                    error!(%reason, "reload refused");
                    return Err(reason.to_owned());
                }
                if this.busy.swap(true, Ordering::SeqCst) {
                    let reason = "a reload is already under way";
                    error!(%reason, "reload refused");
                    return Err(reason.to_owned());
                }
                let _busy = Busy(Arc::clone(&this.busy));
                notify::reloading();
                let outcome = this.start(upgraded).await;
                match &outcome {
                    Ok(Reloaded::InPlace(done)) => {
                        info!(%done, "reloaded");
                        notify::ready();
                    }
                    // The successor says READY=1 (and MAINPID=) once it serves.
                    Ok(Reloaded::Restarted(done)) => info!(%done, "reloaded"),
                    Err(reason) => {
                        error!(%reason, "reload refused; the running configuration goes on");
                        notify::ready();
                    }
                }
                outcome.map(|(Reloaded::InPlace(done) | Reloaded::Restarted(done))| done)
            })
        })
    }

    async fn start(self, mut upgraded: watch::Receiver<bool>) -> Result<Reloaded, String> {
        let new = sluice::config::load_file(&self.config).map_err(|e| e.to_string())?;
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
        let binary = installed(&exe);
        // A replaced binary (a package upgrade) is taken up by a new process, whatever changed.
        let upgraded_binary = binary != exe;
        if !upgraded_binary {
            if let Some(applied) = self.in_place.apply(&new) {
                return Ok(Reloaded::InPlace(describe(&applied)));
            }
        }
        let changed = match self.in_place.differences(&new) {
            _ if upgraded_binary => "the binary (replaced on disk)".to_owned(),
            d if d.is_empty() => "nothing but what a new process applies".to_owned(),
            d => d.join(", "),
        };
        info!(%changed, "reloading with a new process (hot restart)");
        let mut cmd = Command::new(binary);
        cmd.args(["--log-format", self.log_format, "run", "--upgrade", "-c"])
            .arg(&self.config)
            .stdin(Stdio::null());
        if let Some(n) = self.workers {
            cmd.arg("--workers").arg(n.to_string());
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start the new process: {e}"))?;
        let pid = child.id().unwrap_or(0);
        // Before it can take over: the proxy may return as soon as it has.
        self.started.store(pid, Ordering::SeqCst);
        let taken_over = async {
            loop {
                let done = *upgraded.borrow_and_update();
                if done {
                    return;
                }
                if upgraded.changed().await.is_err() {
                    // The proxy is gone without a successor: this never resolves.
                    std::future::pending::<()>().await;
                }
            }
        };
        let outcome = tokio::select! {
            status = child.wait() => Err(format!(
                "the new process ({pid}) exited before taking over ({}); see its log",
                status.map_or_else(|e| e.to_string(), |s| s.to_string())
            )),
            () = taken_over => return Ok(Reloaded::Restarted(format!(
                "process {pid} took over ({changed}); this one drains and exits"
            ))),
            () = tokio::time::sleep(TAKE_OVER_TIMEOUT) => {
                let _ = child.kill().await;
                Err(format!("the new process ({pid}) did not take over within {TAKE_OVER_TIMEOUT:?}; stopped it"))
            }
        };
        self.started.store(0, Ordering::SeqCst);
        outcome
    }
}

/// One line on what an in-place reload changed.
fn describe(a: &Applied) -> String {
    let mut parts = Vec::new();
    if a.routes {
        parts.push("routes replaced".to_owned());
    }
    if !a.added.is_empty() {
        parts.push(format!("endpoints added: {}", a.added.join(", ")));
    }
    if !a.removed.is_empty() {
        parts.push(format!("endpoints removed: {}", a.removed.join(", ")));
    }
    if !a.certificates.is_empty() {
        let listeners = a.certificates.join(", ");
        parts.push(format!("certificates replaced on {listeners}"));
    }
    if parts.is_empty() {
        parts.push("nothing changed".to_owned());
    }
    format!(
        "applied in place ({}); connections and sessions carry on",
        parts.join("; ")
    )
}

/// Without a way to reload, says so on every SIGHUP (which would otherwise end the process or
/// pass unnoticed) instead of reloading.
pub(crate) async fn explain_sighup(why: &'static str) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        return;
    };
    while hup.recv().await.is_some() {
        warn!(reason = why, "SIGHUP ignored: cannot reload");
    }
}

/// Reloads on every SIGHUP.
pub(crate) async fn on_sighup(hook: ReloadHook) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        return error!("cannot listen for SIGHUP; reload through the admin API instead");
    };
    while hup.recv().await.is_some() {
        info!("SIGHUP: reloading");
        // The hook logs the outcome.
        let _ = hook.run().await;
    }
}

/// The binary a successor starts from: this process's, or, once a package upgrade has replaced
/// the file (Linux then names it `PATH (deleted)`), the new one at the same path, as NGINX's
/// binary upgrade starts the binary that is installed now. A reload then always starts it.
fn installed(exe: &std::path::Path) -> PathBuf {
    let replaced = exe.to_str().and_then(|p| p.strip_suffix(" (deleted)"));
    match replaced {
        Some(path) if std::path::Path::new(path).is_file() => PathBuf::from(path),
        _ => exe.to_owned(),
    }
}
