//! The three programs as the harness runs them: child processes on real sockets, talking to
//! each other, their JSON read back.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

#[test]
fn openloop_gets_every_answer_and_leaves_the_warmup_out() {
    let backend = Backend::start(&[]);
    let report = openloop(
        &backend.url("/"),
        &["--rate", "200", "--duration", "1", "--warmup", "0.25"],
    );
    assert_eq!(report["scheduled"], 200, "{report}");
    assert_eq!(report["sent"], 200, "{report}");
    assert_eq!(report["not_sent"], 0, "{report}");
    assert_eq!(report["completed"], 200, "{report}");
    assert_eq!(
        report["status"],
        serde_json::json!({"200": 200}),
        "{report}"
    );
    assert_eq!(
        report["errors"],
        serde_json::json!({"connect": 0, "timeout": 0, "io": 0})
    );
    let ok = &report["latency_us_ok"];
    let us = |q: &str| ok[q].as_u64().unwrap_or(0);
    assert!(
        0 < us("p50") && us("p50") <= us("p99") && us("p99") <= us("max"),
        "{report}"
    );
    let stats = backend.stats("GET", "/stats");
    assert_eq!(
        stats["requests"], 250,
        "the warmup reached the backend too: {stats}"
    );
    assert_eq!(stats["in_flight"], 0, "{stats}");
    let reset = backend.stats("POST", "/reset");
    assert_eq!(reset["requests"], 0, "{reset}");
}

#[test]
fn a_delay_makes_requests_overlap_on_several_connections() {
    let backend = Backend::start(&["--delay-ms", "100"]);
    let args = ["--rate", "200", "--duration", "0.5", "--spin-us", "300"];
    let report = openloop(&backend.url("/"), &args);
    assert_eq!(report["status"]["200"], 100, "{report}");
    assert!(
        report["latency_us_ok"]["p50"].as_u64() >= Some(100_000),
        "{report}"
    );
    // 200/s for 100 ms each: about 20 at once.
    assert!(report["max_open_conns"].as_u64() >= Some(5), "{report}");
    let stats = backend.stats("GET", "/stats");
    assert!(stats["max_in_flight"].as_u64() >= Some(5), "{stats}");
    // One request at a time per connection: as many accepted as were in flight at once.
    assert!(
        stats["connections"].as_u64() >= stats["max_in_flight"].as_u64(),
        "{stats}"
    );
}

#[test]
fn the_query_sets_the_body_size_and_garbage_is_a_400() {
    let backend = Backend::start(&["--body-bytes", "5"]);
    let (head, body) = get(&backend.addr, "/");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain"),
        "{head}"
    );
    assert_eq!(body, b"hello");
    let (head, body) = get(&backend.addr, "/x?bytes=2048&delay_ms=1");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body.len(), 2048);
    let (head, _) = get(&backend.addr, "/?bytes=lots");
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
}

#[test]
fn a_closed_port_gives_connect_errors() {
    let (_held, addr) = closed_port();
    let report = openloop(
        &format!("http://{addr}/"),
        &["--rate", "100", "--duration", "0.5"],
    );
    assert_eq!(report["sent"], 50, "{report}");
    assert_eq!(report["completed"], 0, "{report}");
    assert_eq!(report["errors"]["connect"], 50, "{report}");
}

#[test]
fn unanswered_requests_time_out() {
    let backend = Backend::start(&["--delay-ms", "3000"]);
    let args = ["--rate", "20", "--duration", "0.5", "--timeout-ms", "300"];
    let report = openloop(&backend.url("/"), &args);
    assert_eq!(report["errors"]["timeout"], 10, "{report}");
    assert_eq!(report["completed"], 0, "{report}");
}

#[test]
fn busy_connections_bound_what_is_sent() {
    let backend = Backend::start(&["--delay-ms", "1500"]);
    let args = ["--rate", "20", "--duration", "0.5", "--max-conns", "2"];
    let report = openloop(&backend.url("/"), &args);
    assert_eq!(report["sent"], 2, "{report}");
    assert_eq!(report["not_sent"], 8, "{report}");
    assert_eq!(report["status"]["200"], 2, "{report}");
    assert_eq!(report["max_open_conns"], 2, "{report}");
}

#[test]
fn slow_clients_read_whole_responses_no_faster_than_their_rate() {
    let backend = Backend::start(&[]);
    let out = run(
        env!("CARGO_BIN_EXE_slowclients"),
        &[
            "--url",
            &backend.url("/?bytes=2048"),
            "--clients",
            "3",
            "--duration",
            "1.5",
        ],
        &["--read-rate", "8192"],
    );
    let report = json(&out);
    assert_eq!(report["clients"], 3, "{report}");
    assert_eq!(report["connected"], 3, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    assert!(
        report["responses_completed"].as_u64() >= Some(3),
        "{report}"
    );
    let bytes = report["bytes_read"].as_u64().unwrap_or(0);
    assert!(bytes >= 3 * 2048, "{report}");
    // 2048 bytes per 250 ms tick: at most 7 ticks in 1.5 s for each of 3 clients.
    assert!(bytes <= 3 * 7 * 2048, "{report}");
}

#[test]
fn bad_flags_are_refused_with_a_message() {
    let backend = env!("CARGO_BIN_EXE_bench-backend");
    let openloop = env!("CARGO_BIN_EXE_openloop");
    let slow = env!("CARGO_BIN_EXE_slowclients");
    let cases: [(&str, &[&str], &str); 6] = [
        (
            backend,
            &["--listen", "127.0.0.1:0", "--acceptor", "x:1"],
            "cannot be used with",
        ),
        (backend, &["--acceptor", "127.0.0.1:1"], "--service"),
        (backend, &[], "--listen"),
        (
            openloop,
            &["--url", "http://x/", "--rate", "0", "--duration", "1"],
            "positive",
        ),
        (
            openloop,
            &["--url", "https://x/", "--rate", "1", "--duration", "1"],
            "http://",
        ),
        (
            slow,
            &["--url", "http://x/", "--duration", "1", "--clients", "many"],
            "--clients",
        ),
    ];
    for (program, args, message) in cases {
        let out = Command::new(program).args(args).output().expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
}

#[test]
fn sigterm_stops_the_backend_with_status_0() {
    let mut backend = Backend::start(&[]);
    let pid = backend.child.id().to_string();
    let kill = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    assert!(kill.success());
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(status) = backend.child.try_wait().expect("waitable") {
            break status;
        }
        assert!(Instant::now() < deadline, "still running 5 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{status}");
}

/// A `bench-backend --listen 127.0.0.1:0 --stats 127.0.0.1:0`, killed when dropped.
struct Backend {
    child: Child,
    addr: String,
    stats: String,
}

impl Backend {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_bench-backend"))
            .args(["--listen", "127.0.0.1:0", "--stats", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("bench-backend starts");
        let mut lines = BufReader::new(child.stdout.take().expect("piped"));
        let addr = word_after(&mut lines, "listening");
        let stats = word_after(&mut lines, "stats");
        Self { child, addr, stats }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The JSON answer of the stats listener.
    fn stats(&self, method: &str, path: &str) -> Value {
        let (head, body) = request(&self.stats, method, path);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        serde_json::from_slice(&body).expect("stats are JSON")
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads the ready line `<word> ADDR`; returns ADDR.
fn word_after(lines: &mut BufReader<ChildStdout>, word: &str) -> String {
    let mut line = String::new();
    lines.read_line(&mut line).expect("readable stdout");
    match line.trim().split_once(' ') {
        Some((w, addr)) if w == word => addr.to_owned(),
        _ => panic!("expected `{word} ADDR`, got {line:?}"),
    }
}

fn get(addr: &str, path: &str) -> (String, Vec<u8>) {
    request(addr, "GET", path)
}

/// One request on a fresh connection, read until the server closes it.
fn request(addr: &str, method: &str, path: &str) -> (String, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).expect("connects");
    let req = format!("{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).expect("writes");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).expect("reads");
    let at = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a whole head");
    let head = String::from_utf8_lossy(&response[..at]).into_owned();
    (head, response[at + 4..].to_vec())
}

fn openloop(url: &str, args: &[&str]) -> Value {
    json(&run(env!("CARGO_BIN_EXE_openloop"), &["--url", url], args))
}

fn run(program: &str, args: &[&str], more: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .args(more)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{program} failed: {stderr}");
    out
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).expect("one JSON object on stdout")
}

/// An address nothing listens on: a port the OS just handed out and took back.
/// A port that refuses connections for as long as the returned socket lives: bound, never
/// listening. A listener bound and dropped would free its port, which a parallel test could take,
/// or the kernel could pick as a connection's own source port (a TCP self-connect).
fn closed_port() -> (socket2::Socket, String) {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("a socket");
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().expect("an address");
    socket.bind(&any.into()).expect("binds");
    let addr = socket
        .local_addr()
        .expect("bound")
        .as_socket()
        .expect("an IP address");
    (socket, addr.to_string())
}
