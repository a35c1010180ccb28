//! `sluice run` under systemd's `Type=notify`: the test listens on the `NOTIFY_SOCKET` itself
//! (with `SO_PASSCRED`, so each message's sender is known) and checks the messages, in order,
//! across a reload in place, a refused reload and a hot restart, then a stop. And the unit's
//! example configuration (deploy/systemd; `deploy/systemd/check` verifies the unit itself).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
use rustix::process::{kill_process, test_kill_process, Pid, Signal};

/// How long any one step may take.
const PATIENCE: Duration = Duration::from_secs(20);

/// A file whose route answers `body`, and with `second`, a second listener: a change a reload
/// applies only with a new process.
fn config(body: &str, second: bool) -> String {
    let mut text = format!(
        "[runtime]\nupgrade_socket = \"upgrade.sock\"\nshutdown_grace = \"2s\"\n\
         [[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\ndirect_response = {{ status = 200, body = \"{body}\" }}\n"
    );
    if second {
        text.push_str("[[listener]]\nname = \"second\"\nlisten = \"127.0.0.1:0\"\n");
    }
    text
}

/// The `sluice run` started here and, after a hot restart, its successor: both killed if the
/// test ends early.
struct Processes {
    first: Child,
    successor: Option<u32>,
}

impl Drop for Processes {
    fn drop(&mut self) {
        if let Ok(None) = self.first.try_wait() {
            let _ = self.first.kill();
            let _ = self.first.wait();
        }
        if let Some(pid) = self.successor.and_then(|p| Pid::from_raw(p as i32)) {
            let _ = kill_process(pid, Signal::KILL);
        }
    }
}

/// The notify socket, as systemd has it: one datagram per notification, with its sender.
struct NotifySocket {
    socket: UnixDatagram,
}

impl NotifySocket {
    fn bind(path: &Path) -> Self {
        let socket = UnixDatagram::bind(path).unwrap();
        rustix::net::sockopt::set_socket_passcred(&socket, true).unwrap();
        Self { socket }
    }

    /// The next message and its sender's PID, waiting at most [`PATIENCE`].
    fn next(&self, waiting_for: &str) -> (u32, String) {
        self.socket.set_read_timeout(Some(PATIENCE)).unwrap();
        self.recv()
            .unwrap_or_else(|e| panic!("no notification ({waiting_for}): {e}"))
    }

    /// A message already queued, if any.
    fn queued(&self) -> Option<(u32, String)> {
        self.socket.set_nonblocking(true).unwrap();
        let got = self.recv();
        self.socket.set_nonblocking(false).unwrap();
        match got {
            Ok(m) => Some(m),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(e) => panic!("reading the notify socket: {e}"),
        }
    }

    fn recv(&self) -> std::io::Result<(u32, String)> {
        let mut buf = [0u8; 4096];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmCredentials(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = rustix::net::recvmsg(
            &self.socket,
            &mut [IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::empty(),
        )?;
        let pid = control
            .drain()
            .find_map(|m| match m {
                RecvAncillaryMessage::ScmCredentials(c) => Some(c.pid.as_raw_pid() as u32),
                _ => None,
            })
            .expect("SO_PASSCRED gives every message its sender");
        Ok((pid, String::from_utf8(buf[..got.bytes].to_vec()).unwrap()))
    }
}

fn monotonic_usec() -> i64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    now.tv_sec * 1_000_000 + now.tv_nsec / 1_000
}

/// `RELOADING=1` with a `MONOTONIC_USEC` between `before` and now (CLOCK_MONOTONIC).
fn assert_reloading(text: &str, before: i64) {
    let usec = text
        .strip_prefix("RELOADING=1\nMONOTONIC_USEC=")
        .and_then(|rest| rest.strip_suffix('\n'))
        .and_then(|n| n.parse::<i64>().ok())
        .unwrap_or_else(|| panic!("not RELOADING=1 with MONOTONIC_USEC: {text:?}"));
    assert!(
        (before..=monotonic_usec()).contains(&usec),
        "MONOTONIC_USEC={usec} is not CLOCK_MONOTONIC's µs now"
    );
}

fn signal(pid: u32, sig: Signal) {
    kill_process(Pid::from_raw(pid as i32).unwrap(), sig).unwrap();
}

/// Whether `pid` still runs (a zombie does not).
fn alive(pid: u32) -> bool {
    let Some(p) = Pid::from_raw(pid as i32) else {
        return false;
    };
    if test_kill_process(p).is_err() {
        return false;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // `pid (comm) S ...`: the state follows the last ')'.
    let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
    !matches!(state.and_then(|s| s.chars().next()), Some('Z' | 'X') | None)
}

/// Polls `done` until it holds, for at most [`PATIENCE`].
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The body of `GET /` (HTTP/1.1, `Connection: close`).
fn get(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        stream,
        "GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response.split_once("\r\n\r\n").unwrap().1.to_owned()
}

/// The `public` listener's address, from its `listening` line in the JSON log.
fn public_addr(log: &Receiver<String>) -> SocketAddr {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = log.recv_timeout(left).expect("no `listening` log line");
        if !line.contains(r#""message":"listening""#) {
            continue;
        }
        if let Some((_, rest)) = line.split_once(r#""addr":""#) {
            return rest.split('"').next().unwrap().parse().unwrap();
        }
    }
}

#[test]
fn notifies_systemd_across_reloads_a_hot_restart_and_a_stop() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sluice.toml");
    std::fs::write(&file, config("one", false)).unwrap();
    let notify = NotifySocket::bind(&dir.path().join("notify.sock"));
    let (mut procs, log) = run(Path::new(env!("CARGO_BIN_EXE_sluice")), &file, dir.path());
    let first = procs.first.id();
    let mut seen: Vec<(u32, String)> = Vec::new();
    let mut next = |waiting_for: &str| {
        let m = notify.next(waiting_for);
        seen.push(m.clone());
        m
    };

    // Start: READY=1 once it serves.
    assert_eq!(next("READY at start"), (first, "READY=1\n".into()));
    let addr = public_addr(&log);
    assert_eq!(get(addr), "one");

    // A route alone changed: applied in place, RELOADING=1 then READY=1 from the same process.
    std::fs::write(&file, config("two", false)).unwrap();
    let before = monotonic_usec();
    signal(first, Signal::HUP);
    let (pid, text) = next("RELOADING, in place");
    assert_eq!(pid, first);
    assert_reloading(&text, before);
    assert_eq!(next("READY, in place"), (first, "READY=1\n".into()));
    assert_eq!(get(addr), "two");

    // A file that does not load: refused, the running configuration goes on, READY=1 again.
    std::fs::write(&file, "[[listener]\n").unwrap();
    let before = monotonic_usec();
    signal(first, Signal::HUP);
    let (pid, text) = next("RELOADING, refused");
    assert_eq!(pid, first);
    assert_reloading(&text, before);
    assert_eq!(next("READY, refused"), (first, "READY=1\n".into()));
    assert_eq!(get(addr), "two");

    // A new listener: a hot restart. The successor says MAINPID= and READY=1 once it serves;
    // the old process says MAINPID= of the successor before it exits, and nothing else.
    std::fs::write(&file, config("three", true)).unwrap();
    let before = monotonic_usec();
    signal(first, Signal::HUP);
    let (pid, text) = next("RELOADING, hot restart");
    assert_eq!(pid, first);
    assert_reloading(&text, before);
    let mut from_old = Vec::new();
    let successor = loop {
        let (pid, text) = next("the successor's READY");
        if pid == first {
            from_old.push(text);
            continue;
        }
        procs.successor = Some(pid);
        assert_eq!(text, format!("MAINPID={pid}\nREADY=1\n"));
        break pid;
    };
    assert!(alive(successor), "the new main PID {successor} runs");
    wait_until("the old process exits", || {
        procs.first.try_wait().unwrap().is_some()
    });
    assert!(alive(successor), "the successor outlives its parent");
    // Whatever the old process sent is queued by now.
    while let Some(m) = notify.queued() {
        seen.push(m.clone());
        assert_eq!(
            m.0, first,
            "only the old process had anything to say: {m:?}"
        );
        from_old.push(m.1);
    }
    assert_eq!(from_old, [format!("MAINPID={successor}\n")]);
    wait_until("the successor answers on the inherited listener", || {
        get(addr) == "three"
    });

    // SIGTERM to the new main PID: STOPPING=1, then it exits.
    signal(successor, Signal::TERM);
    let mut next = |waiting_for: &str| {
        let m = notify.next(waiting_for);
        seen.push(m.clone());
        m
    };
    assert_eq!(next("STOPPING"), (successor, "STOPPING=1\n".into()));
    wait_until("the successor exits", || !alive(successor));
    procs.successor = None;

    let shown: Vec<String> = seen
        .iter()
        .map(|(pid, text)| {
            let who = if *pid == first { "first" } else { "successor" };
            format!("{who} ({pid}): {}", text.trim_end().replace('\n', " "))
        })
        .collect();
    eprintln!("notifications, in order:\n  {}", shown.join("\n  "));
    assert!(notify.queued().is_none(), "nothing after STOPPING=1");
}

/// A package upgrade replaces the binary under a running Sluice (dpkg writes the new file and
/// renames it over the old). The next reload starts the new binary in a new process, even when
/// the file alone would have been applied in place: `systemctl reload` after an upgrade is the
/// zero-downtime upgrade.
#[test]
fn a_hot_restart_after_the_binary_was_replaced_starts_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("sluice");
    std::fs::copy(env!("CARGO_BIN_EXE_sluice"), &bin).unwrap();
    let file = dir.path().join("sluice.toml");
    std::fs::write(&file, config("one", false)).unwrap();
    let notify = NotifySocket::bind(&dir.path().join("notify.sock"));
    let (mut procs, log) = run(&bin, &file, dir.path());
    let first = procs.first.id();
    assert_eq!(notify.next("READY at start"), (first, "READY=1\n".into()));
    let addr = public_addr(&log);
    assert_eq!(get(addr), "one");

    let new = dir.path().join("sluice.new");
    std::fs::copy(env!("CARGO_BIN_EXE_sluice"), &new).unwrap();
    std::fs::rename(&new, &bin).unwrap();
    // Only a route changed: in place, but for the new binary.
    std::fs::write(&file, config("three", false)).unwrap();
    signal(first, Signal::HUP);
    assert_eq!(notify.next("RELOADING").0, first);
    // The old process may announce its successor's MAINPID= before the successor's READY=1.
    let (pid, text) = loop {
        let (pid, text) = notify.next("the successor's READY");
        if pid != first {
            break (pid, text);
        }
        assert!(
            text.starts_with("MAINPID="),
            "the reload was refused: {text}"
        );
    };
    procs.successor = Some(pid);
    assert_eq!(text, format!("MAINPID={pid}\nREADY=1\n"));
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert_eq!(exe, bin, "the successor runs the binary installed now");
    wait_until("the successor answers on the inherited listener", || {
        get(addr) == "three"
    });
    signal(pid, Signal::TERM);
    wait_until("the successor exits", || !alive(pid));
    procs.successor = None;
}

/// The `/etc/sluice/sluice.toml` that deploy/systemd/README.md starts from loads, with its
/// upgrade socket in the unit's RuntimeDirectory and the admin token the package's postinst
/// makes (here in a temporary directory, where the file's path is rewritten to).
#[test]
fn the_units_example_configuration_checks() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/systemd/sluice.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    let packaged = "token = \"file:/etc/sluice/admin.token\"";
    assert!(
        text.contains(packaged),
        "the admin API takes the package's token"
    );
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("admin.token");
    std::fs::write(&token, "0123456789abcdef").unwrap();
    let local = format!("token = \"file:{}\"", token.display());
    let copy = dir.path().join("sluice.toml");
    std::fs::write(&copy, text.replace(packaged, &local)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("check")
        .arg("-c")
        .arg(&copy)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains("\nupgrade_socket = \"/run/sluice/upgrade.sock\"\n"),
        "{text}"
    );
}

/// `sluice acceptor` says READY=1 once bound and STOPPING=1 on SIGTERM.
#[test]
fn a_standalone_acceptor_notifies_ready_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("acceptor.toml");
    std::fs::write(
        &file,
        "[acceptor]\nlisten = \"127.0.0.1:0\"\n[handoff]\nlisten = \"handoff.sock\"\n\
         [cluster.api]\nkind = \"reverse\"\n",
    )
    .unwrap();
    let notify = NotifySocket::bind(&dir.path().join("notify.sock"));
    let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["acceptor", "-c"])
        .arg(&file)
        .env("NOTIFY_SOCKET", dir.path().join("notify.sock"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut procs = Processes {
        first: child,
        successor: None,
    };
    let pid = procs.first.id();
    assert_eq!(notify.next("READY"), (pid, "READY=1\n".into()));
    assert!(
        dir.path().join("handoff.sock").exists(),
        "bound before READY"
    );
    signal(pid, Signal::TERM);
    assert_eq!(notify.next("STOPPING"), (pid, "STOPPING=1\n".into()));
    wait_until("the acceptor exits", || {
        procs.first.try_wait().unwrap().is_some()
    });
    assert!(notify.queued().is_none(), "nothing after STOPPING=1");
}

/// `program run -c file` with the JSON log and `dir/notify.sock` as its `NOTIFY_SOCKET`; its
/// log lines arrive on the receiver.
fn run(program: &Path, file: &Path, dir: &Path) -> (Processes, Receiver<String>) {
    let mut command = Command::new(program);
    command
        .args(["--log-format", "json", "run", "-c"])
        .arg(file)
        .env("RUST_LOG", "info")
        .env("NOTIFY_SOCKET", dir.join("notify.sock"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = spawn_fresh_copy(&mut command);
    let stderr = child.stderr.take().unwrap();
    let (tx, log) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let procs = Processes {
        first: child,
        successor: None,
    };
    (procs, log)
}

/// Spawns `command`, whose program may have just been copied: while another test's child is being
/// forked, the copy's write descriptor lives on in it for a moment and exec fails with
/// ETXTBSY (rust-lang/rust#114554); a few bounded tries wait that out.
fn spawn_fresh_copy(command: &mut Command) -> Child {
    for _ in 0..50 {
        match command.spawn() {
            Ok(child) => return child,
            Err(e) if e.raw_os_error() == Some(26) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("cannot start the copied binary: {e}"),
        }
    }
    panic!("the copied binary stayed busy (ETXTBSY)");
}
