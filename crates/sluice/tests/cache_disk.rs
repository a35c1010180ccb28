//! A route cache's disk tier through real proxies and a real upstream: an answer stored on
//! disk is a hit for the next proxy over the same directory (a restart), a file cut short or
//! changed is a miss and never served, the files stay within `max_size`, an answer past
//! `max_object` leaves no file, and the configuration's refusals. The `sluice` binary across
//! a hot restart, a plain restart and a SIGKILL mid-write: `sluice-cli/tests/cache_disk.rs`.
#![allow(clippy::unwrap_used)]

use crate::support::{assert_refused_at, client, send, Reply, TestProxy};

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// An origin that answers every path `max-age=600` with `<path> <n>` (its n-th request for
/// the path), padded with `-` to the length its last segment names (`/a/2000`); under
/// `/chunked/` without a `Content-Length`, in chunks of 1000 bytes.
#[derive(Clone)]
struct Origin {
    addr: SocketAddr,
    seen: Arc<Mutex<HashMap<String, usize>>>,
}

impl Origin {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = Origin {
            addr: listener.local_addr().unwrap(),
            seen: Arc::default(),
        };
        let serving = origin.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let origin = serving.clone();
                let svc = hyper::service::service_fn(move |req| {
                    let origin = origin.clone();
                    async move { Ok::<_, Infallible>(origin.answer(&req)) }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc),
                );
            }
        });
        origin
    }

    fn seen(&self, path: &str) -> usize {
        self.seen.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    fn answer(&self, req: &Request<Incoming>) -> Response<BoxBody<Bytes, Infallible>> {
        let path = req.uri().path().to_owned();
        let n = {
            let mut seen = self.seen.lock().unwrap();
            let n = seen.entry(path.clone()).or_default();
            *n += 1;
            *n
        };
        let mut body = format!("{path} {n}");
        if let Some(len) = path
            .rsplit('/')
            .next()
            .and_then(|l| l.parse::<usize>().ok())
        {
            body = format!("{body:-<len$}");
        }
        let res = Response::builder().header("cache-control", "max-age=600");
        if path.starts_with("/chunked/") {
            let chunks: Vec<_> = body
                .as_bytes()
                .chunks(1000)
                .map(Bytes::copy_from_slice)
                .collect();
            let frames = chunks.into_iter().map(|c| Ok(hyper::body::Frame::data(c)));
            let stream = StreamBody::new(futures_util::stream::iter(frames));
            return res.body(BodyExt::boxed(stream)).unwrap();
        }
        res.body(Full::new(Bytes::from(body)).boxed()).unwrap()
    }
}

fn config(origin: &Origin, route: &str, cache: &str) -> String {
    format!(
        "[[listener]]\nname = \"t\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\nname = \"{route}\"\ncluster = \"o\"\ncache = {cache}\n\
         [cluster.o]\nkind = \"static\"\nendpoints = [\"{}\"]\n",
        origin.addr
    )
}

async fn ask(p: &TestProxy, path: &str) -> Reply {
    let req = Request::get(p.url(path)).header("host", "a.example");
    send(&client(), req.body(Full::default()).unwrap()).await
}

fn cache_status(r: &Reply) -> &str {
    r.headers
        .get("cache-status")
        .map_or("", |v| v.to_str().unwrap())
}

/// A proxy that runs until it is stopped with [`stop`].
async fn start(origin: &Origin, dir: &Path, route: &str, cache: &str) -> TestProxy {
    TestProxy::start_in(&config(origin, route, cache), dir).await
}

async fn stop(p: TestProxy) {
    p.shutdown();
    p.task.await.unwrap();
}

/// The stored answers' files in `dir`.
fn objects(dir: &Path) -> Vec<PathBuf> {
    let files = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path());
    let objects = files.filter(|p| p.extension().is_some_and(|e| e == "obj"));
    objects.collect()
}

/// The file that holds `text` (a body).
fn file_with(dir: &Path, text: &str) -> PathBuf {
    let holds = |p: &PathBuf| {
        let bytes = std::fs::read(p).unwrap();
        bytes.windows(text.len()).any(|w| w == text.as_bytes())
    };
    objects(dir).into_iter().find(holds).unwrap()
}

fn metric(p: &TestProxy, name: &str) -> Option<f64> {
    let text = p.metrics.render();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
}

#[tokio::test]
async fn an_answer_on_disk_is_a_hit_for_the_next_proxy_over_the_directory() {
    let origin = Origin::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cache = "{ disk = { path = \"cache\" } }";
    let first = start(&origin, dir.path(), "restarted", cache).await;
    let stored = ask(&first, "/a").await;
    assert_eq!(stored.body, "/a 1");
    assert!(cache_status(&stored).contains("stored"), "{stored:?}");
    stop(first).await;
    assert_eq!(objects(&dir.path().join("cache")).len(), 1);

    let second = start(&origin, dir.path(), "restarted", cache).await;
    for _ in 0..2 {
        // Read from disk, then from memory.
        let hit = ask(&second, "/a").await;
        assert_eq!(hit.body, "/a 1");
        assert_eq!(cache_status(&hit), "Sluice; hit", "{hit:?}");
    }
    assert_eq!(origin.seen("/a"), 1);
    let bytes = metric(
        &second,
        "sluice_cache_disk_stored_bytes{route=\"restarted\"}",
    );
    assert!(bytes.unwrap() > 0.0, "{bytes:?}");
    // A purge removes the file too.
    stop(second).await;
}

#[tokio::test]
async fn a_file_cut_short_or_changed_is_a_miss_and_never_served() {
    let origin = Origin::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cache = "{ disk = { path = \"cache\" } }";
    let first = start(&origin, dir.path(), "torn", cache).await;
    assert_eq!(ask(&first, "/cut/2000").await.status, 200);
    assert_eq!(ask(&first, "/flipped/2000").await.status, 200);
    assert_eq!(ask(&first, "/whole").await.body, "/whole 1");
    stop(first).await;
    let files = dir.path().join("cache");
    let cut = file_with(&files, "/cut/2000 1");
    let bytes = std::fs::read(&cut).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let flipped = file_with(&files, "/flipped/2000 1");
    let mut bytes = std::fs::read(&flipped).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x20;
    std::fs::write(&flipped, bytes).unwrap();

    let second = start(&origin, dir.path(), "torn", cache).await;
    for path in ["/cut/2000", "/flipped/2000"] {
        let again = ask(&second, path).await;
        assert!(
            again.body.starts_with(&format!("{path} 2")),
            "{path}: {again:?}"
        );
        assert!(cache_status(&again).contains("fwd=miss"), "{again:?}");
        assert_eq!(origin.seen(path), 2);
    }
    // The cut file was dropped at start, the changed one when read; the good one serves.
    assert!(!cut.exists() && !flipped.exists());
    assert_eq!(ask(&second, "/whole").await.body, "/whole 1");
    assert_eq!(origin.seen("/whole"), 1);
    stop(second).await;
}

#[tokio::test]
async fn the_files_stay_within_max_size() {
    let origin = Origin::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cache = "{ max_object = \"2KiB\", disk = { path = \"cache\", max_size = \"8KiB\" } }";
    let p = start(&origin, dir.path(), "bounded", cache).await;
    for i in 0..24 {
        let r = ask(&p, &format!("/{i}/1500")).await;
        assert_eq!(r.body.len(), 1500);
    }
    let files = objects(&dir.path().join("cache"));
    let total: u64 = files.iter().map(|f| f.metadata().unwrap().len()).sum();
    assert!(total <= 8192, "{} files, {total} bytes", files.len());
    assert!(!files.is_empty());
    let series = |name: &str| metric(&p, &format!("sluice_cache_{name}{{route=\"bounded\"}}"));
    assert!(series("disk_evictions_total").unwrap() >= 1.0);
    assert_eq!(series("disk_stored_bytes"), Some(total as f64));
    stop(p).await;
}

#[tokio::test]
async fn an_answer_past_max_object_streams_to_its_client_and_leaves_no_file() {
    let origin = Origin::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cache = "{ max_object = \"1KiB\", disk = { path = \"cache\" } }";
    let p = start(&origin, dir.path(), "large", cache).await;
    // With a `Content-Length` past it, no file is made; without one, the file goes once the
    // body grows past it, while the body streams on to the client.
    for path in ["/big/5000", "/chunked/5000"] {
        let r = ask(&p, path).await;
        assert_eq!(r.body.len(), 5000, "{path}");
        let left: Vec<_> = std::fs::read_dir(dir.path().join("cache"))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "{path}: {left:?}");
    }
    assert_eq!(ask(&p, "/chunked/5000").await.body.len(), 5000);
    assert_eq!(origin.seen("/chunked/5000"), 2, "not stored");
    assert_eq!(ask(&p, "/chunked/900").await.body.len(), 900);
    assert_eq!(
        objects(&dir.path().join("cache")).len(),
        1,
        "a chunked answer within it is"
    );
    stop(p).await;
}

#[test]
fn bad_disk_settings_are_refused_where_they_are() {
    let text = |cache: &str| {
        format!(
            "[[listener]]\nname = \"t\"\nlisten = \"127.0.0.1:0\"\n\
             [[route]]\ncluster = \"o\"\ncache = {{ disk = {{ path = \"one\" }} }}\n\
             [[route]]\npath_prefix = \"/b\"\ncluster = \"o\"\n{cache}\n\
             [cluster.o]\nkind = \"static\"\nendpoints = [\"127.0.0.1:1\"]\n"
        )
    };
    for (line, message) in [
        (
            "cache = { disk = { path = \"two\", max_size = \"1MiB\" }, max_object = \"2MiB\", memory = \"4MiB\" }",
            "`max_size` must hold one object",
        ),
        (
            "cache = { disk = { path = \"./one\" } }",
            "is the disk tier of route 1 already",
        ),
        ("cache = { disk = { path = \"\" } }", "`path` is empty"),
        (
            "cache = { disk = { path = \"two\", levels = \"1:2\" } }",
            "unknown field `levels`",
        ),
    ] {
        assert_refused_at(&text(line), line, message);
    }
}
