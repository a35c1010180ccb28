//! One QUIC connection served over HTTP/3: its handshake, its requests (a task each, as
//! HTTP/2's streams are), a graceful close (GOAWAY) at the shutdown.

use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;

use bytes::Bytes;
use h3::server::RequestStream;
use http::{HeaderMap, Request, Response};
use http_body::Body;
use http_body_util::{combinators::BoxBody, BodyExt};
use sluice_core::body::RequestBody;
use sluice_core::ClientInfo;
use sluice_net::http::HttpOptions;
use sluice_net::shutdown::ShutdownSignal;
use tokio::task::JoinSet;
use tracing::{debug, Instrument};

use super::body::{declared_length, RecvBody};
use crate::counters::QuicCounters;
use crate::service::{BoxError, H3Service};

/// The ALPN protocol of HTTP/3.
pub const ALPN: &[u8] = b"h3";

/// H3_NO_ERROR (RFC 9114 §8.1): the code of a connection closed because it is done.
pub(super) const NO_ERROR: quinn::VarInt = quinn::VarInt::from_u32(0x100);

/// What every connection of a listener shares.
pub(super) struct Settings {
    http: HttpOptions,
    /// What every client of the listener has in common (the address and trust are a
    /// connection's own).
    client: ClientInfo,
    counters: QuicCounters,
}

impl Settings {
    pub(super) fn new(http: &HttpOptions, local: SocketAddr, counters: QuicCounters) -> Self {
        let client = ClientInfo {
            local,
            tls: true,
            rules: http.rules,
            body_timeout: http.client_body_timeout,
            max_body: http.max_request_body,
            ..ClientInfo::default()
        };
        Self {
            http: http.clone(),
            client,
            counters,
        }
    }

    fn info(&self, peer: SocketAddr) -> ClientInfo {
        let peer = SocketAddr::new(peer.ip().to_canonical(), peer.port());
        let trusted = self
            .http
            .trusted_proxies
            .iter()
            .any(|n| n.contains(&peer.ip()));
        ClientInfo {
            peer,
            trusted,
            ..self.client
        }
    }
}

type H3Conn = h3::server::Connection<h3_quinn::Connection, Bytes>;
type Send = RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;

/// Serves one incoming QUIC connection until it closes, or, after the shutdown, until its
/// requests have ended; `slot` (its client's share of the per-client limit) goes with it.
pub(super) async fn serve<S: H3Service>(
    incoming: quinn::Incoming,
    service: S,
    settings: Arc<Settings>,
    signal: ShutdownSignal,
    slot: Option<crate::per_client::Slot>,
) {
    let info = settings.info(incoming.remote_address());
    let span = tracing::debug_span!("quic", client.addr = %info.peer);
    async move {
        // The handshake within the header timeout, as a TLS handshake over TCP.
        let handshake = tokio::time::timeout(settings.http.request_header_timeout, incoming);
        let quic = match handshake.await {
            Ok(Ok(quic)) => quic,
            Ok(Err(error)) => return debug!(%error, "QUIC handshake failed"),
            Err(_) => return debug!("QUIC handshake timed out"),
        };
        settings.counters.handshakes.inc();
        let mut builder = h3::server::builder();
        let max_field = u64::try_from(settings.http.max_header_bytes).unwrap_or(u64::MAX);
        builder.max_field_section_size(max_field);
        let h3 = match builder.build(h3_quinn::Connection::new(quic.clone())).await {
            Ok(h3) => h3,
            Err(error) => return debug!(%error, "HTTP/3 connection setup failed"),
        };
        requests(h3, service, &settings, &signal, info).await;
        // Told to finish and done: the client closes once it has every response (closing
        // here could lose the response bytes still unacknowledged), within the drain's grace.
        quic.closed().await;
        drop(slot);
    }
    .instrument(span)
    .await;
}

/// Takes the connection's requests, each served on a task of its own, until the connection
/// ends, or until the shutdown (GOAWAY sent) once the requests it had taken are answered.
async fn requests<S: H3Service>(
    mut h3: H3Conn,
    service: S,
    settings: &Settings,
    signal: &ShutdownSignal,
    info: ClientInfo,
) {
    let mut tasks = JoinSet::new();
    let mut stopping = false;
    loop {
        if stopping && tasks.is_empty() {
            break;
        }
        tokio::select! {
            accepted = h3.accept(), if !stopping => match accepted {
                Ok(Some(resolver)) => {
                    let timeout = settings.http.request_header_timeout;
                    let requests = settings.counters.requests.clone();
                    let svc = service.clone();
                    tasks.spawn(async move {
                        let resolved = tokio::time::timeout(timeout, resolver.resolve_request());
                        let (req, stream) = match resolved.await {
                            Ok(Ok(resolved)) => resolved,
                            Ok(Err(error)) => return debug!(%error, "HTTP/3 request refused"),
                            Err(_) => return debug!("HTTP/3 request head not complete in time"),
                        };
                        requests.inc();
                        serve_request(req, stream, svc, info).await;
                    });
                }
                Ok(None) => break,
                Err(error) => {
                    debug!(%error, "HTTP/3 connection ended");
                    break;
                }
            },
            () = signal.wait(), if !stopping => {
                stopping = true;
                if let Err(error) = h3.shutdown(0).await {
                    debug!(%error, "HTTP/3 GOAWAY not sent");
                }
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    while tasks.join_next().await.is_some() {}
}

/// One request: handed to the service as every transport's is, its answer sent back.
async fn serve_request<S: H3Service>(
    req: Request<()>,
    stream: RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>,
    service: S,
    info: ClientInfo,
) {
    let (mut send, recv) = stream.split();
    let (parts, ()) = req.into_parts();
    let body = RecvBody::new(recv, declared_length(&parts.headers));
    let body: BoxBody<Bytes, BoxError> = body.boxed();
    let mut req = Request::from_parts(parts, RequestBody::Boxed(body));
    req.extensions_mut().insert(info);
    let Ok(res) = service.serve(req).await;
    if let Err(error) = respond(&mut send, res).await {
        debug!(%error, "HTTP/3 response not sent whole");
        send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
    }
}

/// Sends `res` on the stream: its head, its data frames, its trailers.
async fn respond<B>(send: &mut Send, res: Response<B>) -> Result<(), BoxError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let (mut parts, body) = res.into_parts();
    strip_connection_fields(&mut parts.headers);
    send.send_response(Response::from_parts(parts, ())).await?;
    let mut body = pin!(body);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(Into::into)?;
        match frame.into_data() {
            Ok(data) if data.is_empty() => {}
            Ok(data) => send.send_data(data).await?,
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    send.send_trailers(trailers).await?;
                    break;
                }
            }
        }
    }
    send.finish().await?;
    Ok(())
}

/// Removes the fields HTTP/3 has no place for (RFC 9114 §4.2: a message with them is
/// malformed), as hyper's HTTP/2 server does for its own.
fn strip_connection_fields(headers: &mut HeaderMap) {
    use http::header::{CONNECTION, TRANSFER_ENCODING, UPGRADE};
    for name in [CONNECTION, TRANSFER_ENCODING, UPGRADE] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}
