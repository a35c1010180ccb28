//! The `sluice` binary as an operator uses it: `check` exit codes and messages, and `run`
//! serving until SIGTERM, then exiting 0.
//!
//! `sluice run` without `-c` is not tested: its embedded config binds the fixed port
//! 127.0.0.1:8080, which parallel test runs cannot share.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long the proxy may take to start or to stop.
const PATIENCE: Duration = Duration::from_secs(4);

fn sluice() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.env("RUST_LOG", "info").env_remove("SLUICE_LOG_FORMAT");
    cmd
}

fn check(config: &Path) -> Output {
    sluice()
        .arg("check")
        .arg("-c")
        .arg(config)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn check_accepts_the_static_example() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/configs/static.toml");
    let out = check(&path);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!("{}: ok (1 listener, 2 routes, 1 cluster)\n", path.display())
    );
}

#[test]
fn check_accepts_a_file_of_relays_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("relay.toml");
    let relay = "[[relay]]\nname = \"edge\"\nlisten = \"127.0.0.1:0\"\nto = \"127.0.0.1:1\"\n";
    std::fs::write(&path, relay).unwrap();
    let out = check(&path);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let expected = "ok (0 listeners, 0 routes, 0 clusters, 1 relay)\n";
    assert!(
        text(&out.stdout).ends_with(expected),
        "{}",
        text(&out.stdout)
    );
}

/// Issue 28, item 16: a file with listeners and no route answers everything 404; `check`
/// says so (and still passes), and a value of the wrong type names its key.
#[test]
fn check_warns_of_no_routes_and_names_a_mistyped_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.toml");
    std::fs::write(
        &path,
        "[[listener]]\nname = \"x\"\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let out = check(&path);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("warning: no [[route]]"),
        "{}",
        text(&out.stderr)
    );
    let typed = dir.path().join("typed.toml");
    let bad = "[[listener]]\nname = \"x\"\nlisten = \"127.0.0.1:0\"\nhttp2 = \"yes\"\n";
    std::fs::write(&typed, bad).unwrap();
    let out = check(&typed);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains(":4:9: `http2`: invalid type"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn check_points_at_the_bad_value_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[[listener]]\nname = \"x\"\nlisten = \"not-an-addr\"\n",
    )
    .unwrap();
    let out = check(&path);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    let expected = format!(
        "{}:3:10: invalid socket address `not-an-addr`",
        path.display()
    );
    assert!(stderr.starts_with(&expected), "{stderr}");
    assert!(out.stdout.is_empty());
}

/// Issue 48, item 8: CI can check a config's shape without its secrets. `--no-secrets` reads
/// no `env:`/`file:` secret but still checks each reference's form and everything else; a
/// plain check still needs them.
#[test]
fn check_no_secrets_validates_a_config_whose_secrets_are_absent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secrets.toml");
    let config = |token: &str| {
        format!(
            "[admin]\nlisten = \"0.0.0.0:0\"\ntoken = \"env:SLUICE_CLI_TEST_NEVER_SET\"\n\
             [acceptor]\nlisten = \"127.0.0.1:0\"\n\
             [[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n\
             [[route]]\ncluster = \"api\"\n\
             [cluster.api]\nkind = \"reverse\"\ntokens = [{token}]\n"
        )
    };
    std::fs::write(&path, config("\"file:absent/token\"")).unwrap();
    let plain = check(&path);
    assert_eq!(plain.status.code(), Some(2), "{}", text(&plain.stderr));
    assert!(
        text(&plain.stderr).contains("SLUICE_CLI_TEST_NEVER_SET"),
        "{}",
        text(&plain.stderr)
    );
    let shape = || {
        sluice()
            .args(["check", "--no-secrets", "-c"])
            .arg(&path)
            .output()
            .unwrap()
    };
    let out = shape();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(": ok (") && text(&out.stdout).contains("secrets not read"),
        "{}",
        text(&out.stdout)
    );
    // The shape is still checked: a reference with no name, a mistyped key.
    std::fs::write(&path, config("\"env:\"")).unwrap();
    let out = shape();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("`env:` names no variable"),
        "{}",
        text(&out.stderr)
    );
    std::fs::write(&path, config("\"file:t\"").replace("tokens", "tokenz")).unwrap();
    assert_eq!(shape().status.code(), Some(2));
    // `sluice check --help` says how.
    let help = sluice().args(["check", "--help"]).output().unwrap();
    assert!(
        text(&help.stdout).contains("--no-secrets"),
        "{}",
        text(&help.stdout)
    );
}

/// Issue 48, item 7: `sluice run` raises its soft open-files limit to the hard one, so a
/// shell's 1024 (or less) does not cap the connections a proxy holds.
#[test]
fn run_raises_the_open_files_limit_to_the_hard_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("min.toml");
    std::fs::write(
        &path,
        "[[listener]]\nname = \"p\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\ndirect_response = { status = 200, body = \"ok\" }\n",
    )
    .unwrap();
    // The test's own soft limit lowered for the child only, by the shell that execs it.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -Sn 256 && exec {} run -c {}",
            env!("CARGO_BIN_EXE_sluice"),
            path.display()
        ))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let limits = format!("/proc/{}/limits", child.id());
    let deadline = Instant::now() + PATIENCE;
    let row = loop {
        let text = std::fs::read_to_string(&limits).unwrap_or_default();
        let row: Vec<String> = text
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .map(|l| {
                l.split_whitespace()
                    .skip(3)
                    .take(2)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        if row.len() == 2 && (row[0] == row[1] || Instant::now() > deadline) {
            break row;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(row.len(), 2, "no open files limit in {limits}");
    assert_eq!(row[0], row[1], "soft {} is below hard {}", row[0], row[1]);
}

#[test]
fn check_of_a_missing_file_names_it_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing.toml");
    let out = check(&path);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(&format!("{}: cannot read configuration", path.display())),
        "{stderr}"
    );
}

#[test]
fn run_with_a_missing_file_exits_1_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing.toml");
    let out = sluice().arg("run").arg("-c").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("sluice: {}: cannot read", path.display())),
        "{stderr}"
    );
}

/// A port-0 listener with a direct-response route.
const MINIMAL_CONFIG: &str = r#"
[[listener]]
name = "cli-test"
listen = "127.0.0.1:0"

[[route]]
path_prefix = "/healthz"
direct_response = { status = 200, body = "ok\n" }
"#;

/// A `sluice run` child; killed if the test ends before it exits on its own.
struct Running {
    child: Child,
    /// Lines of its JSON log (stderr), until it exits.
    log: Receiver<String>,
    dir: tempfile::TempDir,
}

impl Running {
    /// Starts `sluice run -c <config> <extra>` on a port-0 listener with a direct-response
    /// route, logging JSON so that the bound address can be read from the log.
    fn start(extra: &[&str]) -> Self {
        Self::start_logging("json", extra)
    }

    /// [`start`](Self::start) with `--log-format format`.
    fn start_logging(format: &str, extra: &[&str]) -> Self {
        Self::start_with(format, MINIMAL_CONFIG, extra)
    }

    /// `sluice --log-format format run -c <config> <extra>`, with `config` written to a
    /// temporary directory (its `sluice.toml`).
    fn start_with(format: &str, config_text: &str, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config: PathBuf = dir.path().join("sluice.toml");
        std::fs::write(&config, config_text).unwrap();
        let mut child = sluice()
            .args(["--log-format", format, "run", "-c"])
            .arg(&config)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Self { child, log, dir }
    }

    /// Waits for the listener's `listening` log line and returns the address it reports.
    fn serving_addr(&self) -> SocketAddr {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .log
                .recv_timeout(left)
                .expect("sluice did not log `listening`");
            if let Some(addr) = listening_addr(&line) {
                return addr;
            }
        }
    }

    /// Sends `signal` (a `kill` name such as `HUP`).
    fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap();
        assert!(sent.success());
    }

    /// Waits for a log line containing `text`; `None` if the process exits first.
    fn wait_log(&self, text: &str) -> Option<String> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.log.recv_timeout(left) {
                Ok(line) if line.contains(text) => return Some(line),
                Ok(_) => {}
                Err(RecvTimeoutError::Disconnected) => return None,
                Err(RecvTimeoutError::Timeout) => panic!("no log line with {text:?}"),
            }
        }
    }

    /// Sends SIGTERM and waits for the exit, returning the log lines written meanwhile.
    fn terminate(mut self) -> (std::process::ExitStatus, Vec<String>) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(sent.success());
        // stderr reaches EOF when the process exits.
        let deadline = Instant::now() + PATIENCE;
        let mut lines = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.log.recv_timeout(left) {
                Ok(line) => lines.push(line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => panic!("sluice did not exit on SIGTERM"),
            }
        }
        (self.child.wait().unwrap(), lines)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One HTTP/1.1 GET over a plain socket; returns the raw response.
fn http_get(addr: SocketAddr, path: &str) -> String {
    exchange(addr, &format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n"))
}

/// Sends `head` (request line and headers, without the blank line) with `Connection: close`
/// and returns the raw response.
fn exchange(addr: SocketAddr, head: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(stream, "{head}Connection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

fn serves_then_exits_0_on_sigterm(extra: &[&str]) {
    let running = Running::start(extra);
    let addr = running.serving_addr();
    let response = http_get(addr, "/healthz");
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.ends_with("\r\n\r\nok\n"), "{response}");

    let (status, log) = running.terminate();
    assert_eq!(status.code(), Some(0), "{log:#?}");
    assert!(
        log.iter()
            .any(|l| l.contains(r#""message":"sluice stopped""#)),
        "{log:#?}"
    );
}

#[test]
fn run_serves_until_sigterm_and_exits_0() {
    serves_then_exits_0_on_sigterm(&[]);
}

#[test]
fn run_with_one_worker_serves_until_sigterm_and_exits_0() {
    serves_then_exits_0_on_sigterm(&["--workers", "1"]);
}

#[test]
fn sighup_without_upgrade_socket_says_why_it_does_not_reload() {
    let running = Running::start(&[]);
    running.serving_addr();
    running.signal("HUP");
    let line = running.wait_log("SIGHUP").expect("sluice exited on SIGHUP");
    assert!(line.contains("upgrade_socket"), "{line}");
    // It goes on serving, and still stops cleanly.
    let (status, log) = running.terminate();
    assert_eq!(status.code(), Some(0), "{log:#?}");
}

#[test]
fn help_names_every_command() {
    let out = sluice().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = text(&out.stdout);
    let about = help.lines().next().unwrap_or("");
    for command in ["run", "acceptor", "check", "ctl", "demo"] {
        assert!(about.contains(command), "{about:?} does not name {command}");
        assert!(help.contains(&format!("\n  {command} ")), "{help}");
    }
}

#[test]
fn text_logs_to_a_pipe_carry_no_colour_codes() {
    let running = Running::start_logging("text", &[]);
    let line = running.wait_log("listening").expect("sluice exited");
    assert!(!line.contains('\x1b'), "{line:?}");
    let (status, log) = running.terminate();
    assert_eq!(status.code(), Some(0), "{log:#?}");
    assert!(log.iter().all(|l| !l.contains('\x1b')), "{log:#?}");
}

/// The listener's address in its `listening` line (JSON log).
fn listening_addr(line: &str) -> Option<SocketAddr> {
    if !line.contains(r#""message":"listening""#) {
        return None;
    }
    let (_, rest) = line.split_once(r#""addr":""#)?;
    rest.split('"').next()?.parse().ok()
}

#[test]
fn each_listener_is_logged_once_at_startup() {
    let running = Running::start(&[]);
    let mut lines: Vec<String> = Vec::new();
    let mut addr = None;
    while addr.is_none() || !lines.iter().any(|l| l.contains("sluice started")) {
        let line = running
            .log
            .recv_timeout(PATIENCE)
            .expect("sluice did not start");
        addr = addr.or(listening_addr(&line));
        lines.push(line);
    }
    let addr = addr.unwrap();
    assert!(http_get(addr, "/healthz").starts_with("HTTP/1.1 200"));
    let (status, rest) = running.terminate();
    assert_eq!(status.code(), Some(0), "{rest:#?}");
    lines.extend(rest);
    let about_it: Vec<_> = lines
        .iter()
        .filter(|l| l.contains(&addr.to_string()))
        .collect();
    assert_eq!(about_it.len(), 1, "{about_it:#?}");
}

/// `POST /reload` on the admin API (no token: loopback).
fn post_reload(admin: SocketAddr) -> String {
    let head = "POST /reload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n";
    exchange(admin, head)
}

#[test]
fn a_reload_in_place_through_the_admin_api_is_logged_with_what_changed() {
    let config = |body: &str| {
        format!(
            "[runtime]\nupgrade_socket = \"upgrade.sock\"\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n\
             [[listener]]\nname = \"cli-test\"\nlisten = \"127.0.0.1:0\"\n\
             [[route]]\ndirect_response = {{ status = 200, body = \"{body}\" }}\n"
        )
    };
    let running = Running::start_with("json", &config("one"), &[]);
    let line = running
        .wait_log("admin API listening")
        .expect("sluice exited");
    let (_, rest) = line
        .split_once(r#""admin.addr":""#)
        .expect("an admin.addr field");
    let admin: SocketAddr = rest.split('"').next().unwrap().parse().unwrap();
    std::fs::write(running.dir.path().join("sluice.toml"), config("two")).unwrap();
    let response = post_reload(admin);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let line = running
        .wait_log(r#""message":"reloaded""#)
        .expect("sluice exited");
    assert!(line.contains("applied in place (routes replaced"), "{line}");
    let (status, log) = running.terminate();
    assert_eq!(status.code(), Some(0), "{log:#?}");
}

/// Issue 27: a node stopped by SIGTERM tells every control link `DRAINING` before the process
/// exits, also when it is idle and would otherwise exit at once (its services then move their
/// sessions at once, not after the link's grace).
#[test]
fn a_stopping_node_says_draining_on_its_control_links_before_it_exits() {
    let config = "[acceptor]\nlisten = \"127.0.0.1:0\"\n\
                  [[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n\
                  [[route]]\ncluster = \"api\"\n[cluster.api]\nkind = \"reverse\"\n";
    let running = Running::start_with("json", config, &[]);
    let line = running.wait_log("acceptor running").expect("sluice exited");
    let addr = line
        .split("acceptor.addr\":\"Some(")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .unwrap_or_else(|| panic!("no acceptor address in {line}"));
    let mut identity = sluice_session::Identity::new("api");
    identity.instance = Some("a".into());
    let reg = sluice_session::Registration {
        identity,
        capacity: Some(1),
        streams: None,
    };
    let mut link = TcpStream::connect(addr).unwrap();
    link.write_all(&reg.encode_control()).unwrap();
    link.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut reader = BufReader::new(link.try_clone().unwrap());
    let mut first = String::new();
    while !first.starts_with("DEMAND") {
        first.clear();
        assert!(reader.read_line(&mut first).unwrap() > 0, "no DEMAND");
    }
    let (status, log) = running.terminate();
    assert_eq!(status.code(), Some(0), "{log:#?}");
    let mut rest = String::new();
    let _ = reader.read_to_string(&mut rest);
    assert!(rest.lines().any(|l| l == "DRAINING"), "{rest:?}");
}
