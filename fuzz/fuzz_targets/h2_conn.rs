//! A whole connection of the own HTTP/2 transport (`sluice_server::h2own`) fed any bytes after
//! the preface, with a pipeline that reads each request's body and answers it: it never
//! panics, it ends once the client's bytes end (no hang), and everything it writes parses as
//! frames.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use sluice_core::body::{ProxyBody, RequestBody};
use sluice_core::ClientInfo;
use sluice_h2::frame::{self, Head, HEAD_LEN, PREFACE};
use sluice_server::h2own::{serve_connection, Answering, Pipeline};
use sluice_server::{HttpOptions, Shutdown};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Reads the request's body (up to a bound) and answers with its length.
struct Echo;

impl Pipeline for Echo {
    fn call(&self, req: Request<RequestBody>) -> Answering {
        Box::pin(async move {
            let mut body = req.into_body();
            let mut n = 0usize;
            while let Some(Ok(frame)) = body.frame().await {
                n += frame.data_ref().map_or(0, Bytes::len);
                if n > 1 << 20 {
                    break;
                }
            }
            Response::new(ProxyBody::full(Bytes::from(n.to_string())))
        })
    }

    fn service_type(&self) -> std::any::TypeId {
        std::any::TypeId::of::<Self>()
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

fuzz_target!(|bytes: &[u8]| {
    runtime().block_on(async {
        let (client, server) = tokio::io::duplex(1 << 16);
        let pipeline: Arc<dyn Pipeline> = Arc::new(Echo);
        let http = HttpOptions::default();
        let shutdown = Shutdown::new();
        let signal = shutdown.signal();
        let serving = serve_connection(server, pipeline, &http, ClientInfo::default(), &signal);
        let (mut read, mut write) = tokio::io::split(client);
        let feeding = async move {
            let mut settings = PREFACE.to_vec();
            frame::write_settings(&mut settings, false, &[]);
            let _ = write.write_all(&settings).await;
            let _ = write.write_all(bytes).await;
            let _ = write.shutdown().await;
        };
        let draining = async move {
            let mut out = Vec::new();
            let _ = read.read_to_end(&mut out).await;
            out
        };
        let all = async { tokio::join!(serving, feeding, draining) };
        let (_, (), out) = tokio::time::timeout(Duration::from_secs(5), all)
            .await
            .expect("the connection ended once the client's bytes did");
        let mut at = 0;
        while at < out.len() {
            let head = Head::parse(&out[at..]).expect("the server writes whole frame heads");
            at += HEAD_LEN + head.len as usize;
            assert!(at <= out.len(), "the server wrote a whole frame");
        }
    });
});
