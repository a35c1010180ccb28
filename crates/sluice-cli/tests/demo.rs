//! `sluice demo` end to end: the real binary on port 0, real sockets, a real signal.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::TcpStream;
use tokio::process::{Child, ChildStdout, Command};

/// Generous bounds for a debug build on a busy machine; none is a readiness sleep.
const START_TIMEOUT: Duration = Duration::from_secs(30);
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
const LOAD_TIMEOUT: Duration = Duration::from_secs(120);

fn demo(extra: &[&str]) -> (Child, Lines<BufReader<ChildStdout>>) {
    demo_logging(extra, Some("warn"), Stdio::inherit())
}

/// [`demo`] with `RUST_LOG` set to `log` (`None`: unset, the demo's own default) and stderr
/// going to `stderr`.
fn demo_logging(
    extra: &[&str],
    log: Option<&str>,
    stderr: Stdio,
) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    match log {
        Some(level) => command.env("RUST_LOG", level),
        None => command.env_remove("RUST_LOG"),
    };
    let mut child = command
        .args([
            "demo",
            "--listen",
            "127.0.0.1:0",
            "--acceptor",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    (child, BufReader::new(stdout).lines())
}

/// Reads lines until the `ready` line; returns the proxy's address.
async fn wait_ready(lines: &mut Lines<BufReader<ChildStdout>>) -> SocketAddr {
    wait_listening(lines, "proxy").await
}

/// Reads lines until the `ready` line; returns the address of `listening <what>=`.
async fn wait_listening(lines: &mut Lines<BufReader<ChildStdout>>, what: &str) -> SocketAddr {
    let prefix = format!("listening {what}=");
    let mut found = None;
    loop {
        let line = lines.next_line().await.unwrap().expect("demo ended early");
        if let Some(addr) = line.strip_prefix(&prefix) {
            found = Some(addr.parse().unwrap());
        }
        if line.starts_with("ready ") {
            return found.unwrap_or_else(|| panic!("no `{prefix}` line before `ready`"));
        }
    }
}

/// One GET over a fresh connection; returns the status code and body.
async fn get(addr: SocketAddr) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = "GET / HTTP/1.1\r\nHost: demo\r\nConnection: close\r\n\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response[9..12].parse().unwrap();
    let (_, body) = response.split_once("\r\n\r\n").unwrap();
    (status, body.to_owned())
}

async fn terminate(mut child: Child) {
    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(EXIT_TIMEOUT, child.wait())
        .await
        .expect("demo did not exit after SIGTERM")
        .unwrap();
    assert!(status.success(), "demo exited with {status}");
}

#[tokio::test]
async fn demo_answers_from_both_instances_and_stops_on_sigterm() {
    let (child, mut lines) = demo(&[]);
    let proxy = tokio::time::timeout(START_TIMEOUT, wait_ready(&mut lines))
        .await
        .expect("demo did not become ready");
    let mut seen = HashSet::new();
    for _ in 0..30 {
        let (status, body) = get(proxy).await;
        assert_eq!(status, 200, "{body}");
        let instance = ["demo-a", "demo-b"]
            .into_iter()
            .find(|i| body.starts_with(&format!("hello from {i} (in flight ")))
            .unwrap_or_else(|| panic!("unexpected body {body:?}"));
        seen.insert(instance);
    }
    assert_eq!(seen.len(), 2, "30 requests reached only {seen:?}");
    terminate(child).await;
}

/// Issue 48, item 6: the banner names the dashboard's URL, and that URL serves it.
#[tokio::test]
async fn the_banner_names_the_dashboard_url() {
    let (child, mut lines) = demo(&[]);
    let admin = tokio::time::timeout(START_TIMEOUT, wait_listening(&mut lines, "admin"))
        .await
        .expect("demo did not become ready");
    let mut banner = String::new();
    let read = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            banner.push_str(&line);
            banner.push('\n');
            if line.starts_with("Ctrl-C stops the demo") {
                break;
            }
        }
    };
    tokio::time::timeout(START_TIMEOUT, read)
        .await
        .expect("no banner");
    let url = format!("http://{admin}/ui");
    assert!(banner.contains(&url), "{banner}");
    let mut stream = TcpStream::connect(admin).await.unwrap();
    let head = format!("GET /ui HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    terminate(child).await;
}

/// A table row: the step label, then each `max/declared` in-flight column.
fn parse_row(line: &str) -> Option<(String, Vec<(usize, usize)>)> {
    let mut fields = line.split_whitespace();
    let label = fields.next()?;
    if !["0.5x", "1x", "2x", "5x", "10x"].contains(&label) {
        return None;
    }
    let in_flight = fields
        .filter_map(|f| f.split_once('/'))
        .map(|(max, declared)| (max.parse().unwrap(), declared.parse().unwrap()))
        .collect();
    Some((label.to_owned(), in_flight))
}

#[tokio::test]
async fn load_prints_five_steps_and_never_exceeds_declared_sessions() {
    // The default logging (no RUST_LOG): the 503s the overload steps cause must not write
    // warnings into the table (issue 28, item 12).
    let (mut child, mut lines) =
        demo_logging(&["--load", "--step-seconds", "1"], None, Stdio::piped());
    let mut stderr = child.stderr.take().unwrap();
    let logged = tokio::spawn(async move {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        text
    });
    let mut rows = Vec::new();
    let read = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            rows.extend(parse_row(&line));
        }
    };
    tokio::time::timeout(LOAD_TIMEOUT, read)
        .await
        .expect("the load did not finish");
    let status = tokio::time::timeout(EXIT_TIMEOUT, child.wait())
        .await
        .expect("demo did not exit after the load")
        .unwrap();
    assert!(status.success(), "demo --load exited with {status}");
    let logged = logged.await.unwrap();
    assert!(
        !logged.contains("WARN"),
        "warnings among the table:\n{logged}"
    );
    let labels: Vec<_> = rows.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(labels, ["0.5x", "1x", "2x", "5x", "10x"]);
    for (label, in_flight) in &rows {
        assert_eq!(in_flight.len(), 2, "step {label}: {in_flight:?}");
        for (max, declared) in in_flight {
            assert!(
                max <= declared,
                "step {label}: {max} in flight > {declared}"
            );
        }
    }
    let declared: Vec<_> = rows[0].1.iter().map(|(_, d)| *d).collect();
    assert_eq!(declared, [8, 4]);
    // At 10x the queue never empties, so every session of every instance is busy.
    let (_, overload) = &rows[4];
    assert!(
        overload.iter().all(|(max, d)| max == d),
        "10x: {overload:?}"
    );
}

/// `sluice ctl` against the demo's admin API; returns the exit status and stdout.
async fn ctl(admin: SocketAddr, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["ctl", "--admin", &format!("http://{admin}")])
        .args(args)
        .env_remove("SLUICE_ADMIN_TOKEN")
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test]
async fn ctl_reads_and_drains_a_running_demo() {
    let (child, mut lines) = demo(&[]);
    let admin = tokio::time::timeout(START_TIMEOUT, wait_listening(&mut lines, "admin"))
        .await
        .expect("demo did not become ready");
    let (ok, status) = ctl(admin, &["--json", "status"]).await;
    assert!(ok, "{status}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let instances = &status["clusters"][0]["instances"];
    assert_eq!(instances[0]["id"], "demo-a");
    assert_eq!(instances[0]["sessions"], 8);
    assert_eq!(instances[1]["id"], "demo-b");
    assert_eq!(instances[1]["sessions"], 4);
    let (ok, table) = ctl(admin, &["status"]).await;
    assert!(
        ok && table.contains("demo-a") && table.contains("demo-b"),
        "{table}"
    );
    let add = [
        "routes",
        "add",
        "slow",
        "--cluster",
        "demo",
        "--slice",
        "slow",
        "--cidr",
        "10.0.0.0/8",
    ];
    let (ok, said) = ctl(admin, &add).await;
    assert!(ok && said.contains("added route slow"), "{said}");
    let (ok, routes) = ctl(admin, &["routes", "list"]).await;
    assert!(ok, "{routes}");
    let first = routes.lines().nth(1).unwrap_or_default();
    assert!(
        first.contains("slow") && first.contains("client=10.0.0.0/8"),
        "{routes}"
    );
    let (ok, said) = ctl(admin, &["routes", "del", "slow"]).await;
    assert!(ok && said.contains("removed route slow"), "{said}");
    let (ok, said) = ctl(admin, &["drain", "demo", "demo-b"]).await;
    assert!(ok, "{said}");
    assert!(said.contains("demo-b"), "{said}");
    let (ok, metrics) = ctl_metrics(admin).await;
    assert!(ok, "{metrics}");
    let active_a = "sluice_sessions{cluster=\"demo\",instance=\"demo-a\",state=\"active\"} 8";
    assert!(metrics.contains(active_a), "{metrics}");
    terminate(child).await;
}

/// Issue 48, item 6: with one acceptor (no control links) `ctl status` shows the capacity
/// each instance declared in its sessions' registrations, not "-".
#[tokio::test]
async fn ctl_status_shows_what_single_acceptor_instances_declared() {
    let (child, mut lines) = demo(&[]);
    let admin = tokio::time::timeout(START_TIMEOUT, wait_listening(&mut lines, "admin"))
        .await
        .expect("demo did not become ready");
    let (ok, status) = ctl(admin, &["--json", "status"]).await;
    assert!(ok, "{status}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let instances = &status["clusters"][0]["instances"];
    assert_eq!(
        (&instances[0]["declared"], &instances[1]["declared"]),
        (&serde_json::json!(8), &serde_json::json!(4)),
        "{status}"
    );
    let (ok, table) = ctl(admin, &["status"]).await;
    assert!(ok, "{table}");
    let declared = |instance: &str| {
        table
            .lines()
            .map(str::split_whitespace)
            .find_map(|mut cols| {
                (cols.next() == Some(instance)).then(|| cols.nth(1).map(str::to_owned))
            })
            .flatten()
    };
    assert_eq!(declared("demo-a").as_deref(), Some("8"), "{table}");
    assert_eq!(declared("demo-b").as_deref(), Some("4"), "{table}");
    terminate(child).await;
}

/// `GET /metrics` over a raw connection.
async fn ctl_metrics(admin: SocketAddr) -> (bool, String) {
    let mut stream = TcpStream::connect(admin).await.unwrap();
    // The admin API without a token serves only loopback Host values (DNS rebinding).
    let head = format!("GET /metrics HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    (response.starts_with("HTTP/1.1 200"), response)
}

/// Issue 28, item 12: a second demo on the default ports says what is wrong once and how to
/// run it beside the first.
#[tokio::test]
async fn a_port_in_use_is_named_once_with_the_way_out() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "demo",
            "--listen",
            &addr,
            "--acceptor",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("Address already in use").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("--listen 127.0.0.1:0"), "{stderr}");
}
