//! A route cache's disk tier across the `sluice` process's life: an answer stored by one
//! process is a hit in its hot-restart successor (`run --upgrade`) and after a plain restart,
//! without the origin asked again; an answer whose writing a SIGKILL cut short is never
//! served, and the next process removes what it left.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long any one step may take.
const PATIENCE: Duration = Duration::from_secs(20);
/// `/slow`'s body: its first half is sent, then the origin waits (the first time).
const SLOW: usize = 200_000;

/// An origin on loopback (a thread per connection) that answers `max-age=600` with
/// `<path> <n>`, its n-th request for the path; the first `/slow` sends half its body, says
/// so on `half_sent`, and waits for `release` before it gives up the connection.
struct Origin {
    addr: SocketAddr,
    seen: Arc<Mutex<HashMap<String, usize>>>,
    half_sent: Receiver<()>,
    release: mpsc::Sender<()>,
}

impl Origin {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let (half_tx, half_sent) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let counts = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (seen, half, released) =
                    (Arc::clone(&counts), half_tx.clone(), Arc::clone(&released));
                std::thread::spawn(move || {
                    let _ = answer(stream, &seen, &half, &released);
                });
            }
        });
        Self {
            addr,
            seen,
            half_sent,
            release,
        }
    }

    fn seen(&self, path: &str) -> usize {
        self.seen.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

fn answer(
    stream: TcpStream,
    seen: &Mutex<HashMap<String, usize>>,
    half: &mpsc::Sender<()>,
    released: &Mutex<Receiver<()>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let path = line.split(' ').nth(1).unwrap_or("/").to_owned();
    loop {
        let mut field = String::new();
        if reader.read_line(&mut field)? == 0 || field == "\r\n" {
            break;
        }
    }
    let n = {
        let mut seen = seen.lock().unwrap();
        let n = seen.entry(path.clone()).or_default();
        *n += 1;
        *n
    };
    let mut body = format!("{path} {n}").into_bytes();
    if path == "/slow" {
        body.resize(SLOW, b'-');
    }
    let mut out = stream;
    write!(
        out,
        "HTTP/1.1 200 OK\r\ncache-control: max-age=600\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n",
        body.len()
    )?;
    if path == "/slow" && n == 1 {
        out.write_all(&body[..SLOW / 2])?;
        out.flush()?;
        let _ = half.send(());
        let _ = released.lock().unwrap().recv_timeout(PATIENCE);
        return Ok(());
    }
    out.write_all(&body)
}

/// The `sluice run` processes a test started, killed if it ends early.
#[derive(Default)]
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// `sluice run -c file` (with `--upgrade`: a hot restart of the one running), its JSON log
/// lines on the receiver.
fn run(procs: &mut Processes, file: &Path, upgrade: bool) -> (usize, Receiver<String>) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command
        .args(["--log-format", "json", "run", "-c"])
        .arg(file)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if upgrade {
        command.arg("--upgrade");
    }
    let mut child = command.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, log) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    procs.0.push(child);
    (procs.0.len() - 1, log)
}

/// The listener's address, from its `listening` log line.
fn listening(log: &Receiver<String>) -> SocketAddr {
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

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `GET path` (HTTP/1.1, `Connection: close`): its `Cache-Status` and body.
fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let status = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("cache-status: ")
                .map(str::to_owned)
        })
        .unwrap_or_default();
    (status, body.to_owned())
}

fn config(dir: &Path, origin: SocketAddr) -> PathBuf {
    let file = dir.join("sluice.toml");
    let text = format!(
        "[runtime]\nupgrade_socket = \"upgrade.sock\"\nshutdown_grace = \"2s\"\n\
         [[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\ncluster = \"o\"\n\
         cache = {{ disk = {{ path = \"cache\", max_size = \"16MiB\" }} }}\n\
         [cluster.o]\nkind = \"static\"\nendpoints = [\"{origin}\"]\n"
    );
    std::fs::write(&file, text).unwrap();
    file
}

/// The names in the cache's directory that start with `prefix`.
fn named(dir: &Path, prefix: &str) -> Vec<String> {
    let names = std::fs::read_dir(dir.join("cache")).unwrap();
    let names = names.map(|e| e.unwrap().file_name().into_string().unwrap());
    names.filter(|n| n.starts_with(prefix)).collect()
}

#[test]
fn an_answer_on_disk_outlives_a_hot_restart_and_a_restart() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), origin.addr);
    let mut procs = Processes::default();
    let (first, log) = run(&mut procs, &file, false);
    let addr = listening(&log);
    let (status, body) = get(addr, "/a");
    assert_eq!(
        (status.as_str(), body.as_str()),
        ("sluice; fwd=miss; stored", "/a 1")
    );
    assert_eq!(get(addr, "/a").0, "sluice; hit");

    // A hot restart: the successor takes the listener; its memory is empty, its disk is not.
    let (_, _successor_log) = run(&mut procs, &file, true);
    wait_until("the first process exits", || {
        procs.0[first].try_wait().unwrap().is_some()
    });
    let (status, body) = get(addr, "/a");
    assert_eq!((status.as_str(), body.as_str()), ("sluice; hit", "/a 1"));
    assert_eq!(origin.seen("/a"), 1);

    // A plain restart: the successor stops, a new process starts on a new port.
    let successor = procs.0.len() - 1;
    let pid = rustix::process::Pid::from_child(&procs.0[successor]);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    wait_until("the successor exits", || {
        procs.0[successor].try_wait().unwrap().is_some()
    });
    let (_, log) = run(&mut procs, &file, false);
    let addr = listening(&log);
    let (status, body) = get(addr, "/a");
    assert_eq!((status.as_str(), body.as_str()), ("sluice; hit", "/a 1"));
    assert_eq!(origin.seen("/a"), 1);
}

#[test]
fn an_answer_cut_by_sigkill_while_stored_is_never_served() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), origin.addr);
    let mut procs = Processes::default();
    let (first, log) = run(&mut procs, &file, false);
    let addr = listening(&log);
    let client = std::thread::spawn(move || {
        let mut stream = TcpStream::connect(addr).unwrap();
        write!(stream, "GET /slow HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
        let mut sink = Vec::new();
        let _ = stream.read_to_end(&mut sink);
    });
    origin.half_sent.recv_timeout(PATIENCE).unwrap();
    // Half the body is on its way through the proxy into its file.
    wait_until("the file being written holds part of the body", || {
        let names = named(dir.path(), "tmp.");
        let len = |n: &String| {
            dir.path()
                .join("cache")
                .join(n)
                .metadata()
                .map_or(0, |m| m.len())
        };
        names.iter().any(|n| len(n) > 0)
    });
    procs.0[first].kill().unwrap();
    procs.0[first].wait().unwrap();
    let _ = origin.release.send(());
    client.join().unwrap();
    assert!(named(dir.path(), "").iter().all(|n| !n.ends_with(".obj")));
    assert_eq!(named(dir.path(), "tmp.").len(), 1, "left by the crash");

    let (_, log) = run(&mut procs, &file, false);
    let addr = listening(&log);
    assert!(named(dir.path(), "tmp.").is_empty(), "removed at start");
    let (status, body) = get(addr, "/slow");
    assert_eq!(status, "sluice; fwd=miss; stored");
    assert_eq!(body.len(), SLOW);
    assert!(body.starts_with("/slow 2"), "{}", &body[..20]);
    assert_eq!(get(addr, "/slow").0, "sluice; hit");
    assert_eq!(origin.seen("/slow"), 2);
}
