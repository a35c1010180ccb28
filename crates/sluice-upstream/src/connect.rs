//! Opening HTTP/1.1 and HTTP/2 client connections to listening endpoints, over TCP or TLS.

use std::net::SocketAddr;
use std::time::Duration;

use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use sluice_config::{H2Options, UpstreamProtocol};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tracing::debug;

use super::tls::UpstreamTls;
use sluice_core::body::ProxyBody;
use sluice_core::error::ProxyError;
use sluice_core::read_ahead::IO_BUFFER_BYTES;

/// Connects to `addr` (and with `tls`, completes the TLS handshake) within `timeout`, and
/// starts an HTTP/1.1 client connection on it.
///
/// The connection's I/O runs in its own task; the returned sender is the only handle to it, and
/// dropping the sender closes the connection.
pub(crate) async fn connect_http1(
    addr: SocketAddr,
    timeout: Duration,
    tls: Option<&UpstreamTls>,
) -> Result<http1::SendRequest<ProxyBody>, ProxyError> {
    let connect = async {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(ProxyError::Connect)?;
        // Requests are written in one go; Nagle would only delay the head behind the body.
        stream.set_nodelay(true).map_err(ProxyError::Connect)?;
        match tls {
            None => start(stream, addr).await,
            Some(tls) => start(tls.handshake(stream, addr).await?, addr).await,
        }
    };
    match tokio::time::timeout(timeout, connect).await {
        Err(_elapsed) => Err(ProxyError::ConnectTimeout),
        Ok(connected) => connected,
    }
}

/// Starts hyper's client connection on an established stream.
async fn start<I>(io: I, addr: SocketAddr) -> Result<http1::SendRequest<ProxyBody>, ProxyError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = http1::Builder::new()
        .max_buf_size(IO_BUFFER_BYTES)
        .handshake(TokioIo::new(io))
        .await
        .map_err(ProxyError::UpstreamProtocol)?;
    // With upgrades, a 101 hands the socket to the proxy's bridge instead of closing it.
    tokio::spawn(async move {
        if let Err(error) = conn.with_upgrades().await {
            debug!(upstream.addr = %addr, %error, "upstream connection ended with an error");
        }
    });
    Ok(sender)
}

/// A client connection of either version.
pub(crate) enum Connected {
    /// HTTP/1.1.
    H1(http1::SendRequest<ProxyBody>),
    /// HTTP/2.
    H2(http2::SendRequest<ProxyBody>),
}

/// Connects to `addr` as `protocol` says, within `timeout`: HTTP/2 with prior knowledge for
/// `h2c`; over TLS, what ALPN agreed (`h2` must be agreed for `h2`; `auto` takes either);
/// else HTTP/1.1.
pub(crate) async fn connect(
    addr: SocketAddr,
    timeout: Duration,
    tls: Option<&UpstreamTls>,
    (protocol, h2): (UpstreamProtocol, &H2Options),
) -> Result<Connected, ProxyError> {
    let connect = async {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(ProxyError::Connect)?;
        stream.set_nodelay(true).map_err(ProxyError::Connect)?;
        let Some(tls) = tls else {
            return match protocol {
                UpstreamProtocol::H2c => start_h2(stream, addr, h2).await.map(Connected::H2),
                _ => start(stream, addr).await.map(Connected::H1),
            };
        };
        let stream = tls.handshake(stream, addr).await?;
        let agreed_h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
        match (protocol, agreed_h2) {
            (_, true) => start_h2(stream, addr, h2).await.map(Connected::H2),
            (UpstreamProtocol::H2, false) => Err(ProxyError::UpstreamTls {
                check: "the endpoint did not agree to HTTP/2 (ALPN h2)",
                detail: format!("{addr} agreed to no h2 by ALPN"),
            }),
            (_, false) => start(stream, addr).await.map(Connected::H1),
        }
    };
    match tokio::time::timeout(timeout, connect).await {
        Err(_elapsed) => Err(ProxyError::ConnectTimeout),
        Ok(connected) => connected,
    }
}

/// Starts hyper's HTTP/2 client connection on an established stream ([`h2_client`]); PINGs
/// keep it alive (and find it dead).
async fn start_h2<I>(
    io: I,
    addr: SocketAddr,
    opts: &H2Options,
) -> Result<http2::SendRequest<ProxyBody>, ProxyError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let streams = u32::try_from(opts.max_streams).unwrap_or(u32::MAX);
    let (sender, conn) = h2_client(streams)
        .keep_alive_interval(opts.keepalive_interval)
        .keep_alive_timeout(opts.keepalive_timeout)
        .keep_alive_while_idle(true)
        .handshake(TokioIo::new(io))
        .await
        .map_err(ProxyError::UpstreamProtocol)?;
    tokio::spawn(async move {
        if let Err(error) = conn.await {
            debug!(upstream.addr = %addr, %error, "upstream HTTP/2 connection ended with an error");
        }
    });
    Ok(sender)
}

/// hyper's HTTP/2 client for a connection that carries up to `streams` streams at once (a
/// static endpoint's, or a dial-in session's): the connection's window holds every stream's,
/// so that a stream whose reader is slow never stalls the others (RFC 9113 §5.2).
pub(crate) fn h2_client(streams: u32) -> http2::Builder<TokioExecutor> {
    let connection_window = STREAM_WINDOW.saturating_mul(streams).min(MAX_WINDOW);
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(connection_window)
        .initial_max_send_streams(usize::try_from(streams).unwrap_or(usize::MAX));
    builder
}

/// What one HTTP/2 stream may have in flight towards the proxy before its reader takes it.
const STREAM_WINDOW: u32 = 256 * 1024;

/// HTTP/2's largest window (RFC 9113 §6.9.1).
const MAX_WINDOW: u32 = (1 << 31) - 1;
