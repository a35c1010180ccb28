//! The copy: `read` into a bounded buffer, `write` out of it (where splice is off or refused,
//! and for a direction the sockmap program delivers to user space).

use std::io;

use tokio::net::TcpStream;

/// The copy buffer per direction.
pub(crate) const CHUNK: usize = 64 * 1024;

/// Copies until EOF through a `CHUNK` buffer.
pub(crate) async fn copy_loop(
    from: &TcpStream,
    to: &TcpStream,
    moved: &impl Fn(usize),
) -> io::Result<()> {
    let mut buf = vec![0; CHUNK];
    loop {
        from.readable().await?;
        let n = match from.try_read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        write_all(to, &buf[..n]).await?;
        moved(n);
    }
}

/// Writes all of `buf` to a non-blocking socket.
pub(crate) async fn write_all(to: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        to.writable().await?;
        match to.try_write(buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Copies what `from` has ready to read now, without waiting for more; returns how much. Asks
/// the socket itself (`MSG_DONTWAIT`), not the reactor's possibly stale readiness.
#[cfg_attr(not(feature = "sockmap"), allow(dead_code))]
pub(crate) async fn copy_ready(from: &TcpStream, to: &TcpStream) -> io::Result<u64> {
    let mut buf = [0u8; 16 * 1024];
    let mut total = 0;
    loop {
        match rustix::net::recv(from, &mut buf, rustix::net::RecvFlags::DONTWAIT) {
            Ok((0, _)) => return Ok(total),
            Ok((n, _)) => {
                write_all(to, &buf[..n]).await?;
                total += n as u64;
            }
            Err(rustix::io::Errno::AGAIN) => return Ok(total),
            Err(e) => return Err(e.into()),
        }
    }
}
