//! Opening HTTP/1.1 client connections to listening endpoints, over TCP or TLS.

use std::net::SocketAddr;
use std::time::Duration;

use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tracing::debug;

use super::tls::UpstreamTls;
use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::http::IO_BUFFER_BYTES;

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
