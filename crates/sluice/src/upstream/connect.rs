//! Opening HTTP/1.1 client connections to listening endpoints.

use std::net::SocketAddr;
use std::time::Duration;

use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tracing::debug;

use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::http::IO_BUFFER_BYTES;

/// Connects to `addr` within `timeout` and starts an HTTP/1.1 client connection on it.
///
/// The connection's I/O runs in its own task; the returned sender is the only handle to it, and
/// dropping the sender closes the connection.
pub async fn connect_http1(
    addr: SocketAddr,
    timeout: Duration,
) -> Result<http1::SendRequest<ProxyBody>, ProxyError> {
    let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Err(_elapsed) => return Err(ProxyError::ConnectTimeout),
        Ok(Err(e)) => return Err(ProxyError::Connect(e)),
        Ok(Ok(stream)) => stream,
    };
    // Requests are written in one go; Nagle would only delay the head behind the body.
    stream.set_nodelay(true).map_err(ProxyError::Connect)?;
    let (sender, conn) = http1::Builder::new()
        .max_buf_size(IO_BUFFER_BYTES)
        .handshake(TokioIo::new(stream))
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
