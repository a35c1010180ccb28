//! What runs inside the bed's namespaces: a server that answers an 8-byte size with that many
//! bytes, a client that measures time to first byte and total time, and a relay.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Instant;

/// Serves sized responses on `addr` forever; prints `ready` once listening.
pub fn serve(addr: SocketAddr) -> io::Result<()> {
    let listener = TcpListener::bind(addr)?;
    println!("ready");
    io::stdout().flush()?;
    for conn in listener.incoming() {
        let mut conn = conn?;
        std::thread::spawn(move || {
            let mut size = [0u8; 8];
            if conn.read_exact(&mut size).is_ok() {
                let mut left = u64::from_be_bytes(size) as usize;
                let chunk = vec![b'x'; 64 * 1024];
                while left > 0 {
                    let n = left.min(chunk.len());
                    if conn.write_all(&chunk[..n]).is_err() {
                        return;
                    }
                    left -= n;
                }
            }
        });
    }
    Ok(())
}

/// Fetches `size` bytes from `addr`: (time to first byte, total time), both from before the
/// connect.
pub fn fetch(addr: SocketAddr, size: u64) -> io::Result<(f64, f64)> {
    let start = Instant::now();
    let mut conn = TcpStream::connect(addr)?;
    conn.set_nodelay(true)?;
    conn.write_all(&size.to_be_bytes())?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    let mut ttfb = None;
    while got < size {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("got {got} of {size}"),
            ));
        }
        ttfb.get_or_insert_with(|| start.elapsed().as_secs_f64() * 1e3);
        got += n as u64;
    }
    Ok((
        ttfb.unwrap_or_default(),
        start.elapsed().as_secs_f64() * 1e3,
    ))
}

/// Runs the `[[relay]]`s of the config file at `path` until killed; prints `ready` once bound.
pub fn relay(path: &std::path::Path) -> io::Result<()> {
    let config = sluice_config::load_file(path).map_err(|e| io::Error::other(e.to_string()))?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let mut relays = Vec::new();
        for r in &config.relays {
            let relay = sluice_relay::Relay::bind(&sluice::options::relay::config(r))?;
            if r.options.sockmap && !relay.handle().sockmap() {
                return Err(io::Error::other(
                    "sockmap = true, but its program did not load (run as root)",
                ));
            }
            relays.push(relay);
        }
        println!("ready");
        io::stdout().flush()?;
        let tasks: Vec<_> = relays
            .into_iter()
            .map(|r| tokio::spawn(r.run(std::future::pending(), std::time::Duration::ZERO)))
            .collect();
        for t in tasks {
            let _ = t.await;
        }
        Ok(())
    })
}

/// Runs `relay` on a thread of its own inside namespace `ns` (setns(2): sockets made after it
/// belong there) until the process ends; returns its counters once it is bound.
pub fn relay_in(ns: &str, relay: sluice_config::Relay) -> io::Result<sluice_relay::RelayHandle> {
    use std::os::fd::AsFd;
    let netns = std::fs::File::open(format!("/run/netns/{ns}"))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let started = (|| {
            rustix::thread::move_into_link_name_space(
                netns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        })();
        let runtime = match started {
            Ok(r) => r,
            Err(e) => return drop(tx.send(Err(e))),
        };
        runtime.block_on(async {
            match sluice_relay::Relay::bind(&sluice::options::relay::config(&relay)) {
                Ok(r) => {
                    let _ = tx.send(Ok(r.handle()));
                    r.run(std::future::pending(), std::time::Duration::ZERO)
                        .await;
                }
                Err(e) => drop(tx.send(Err(e))),
            }
        });
    });
    rx.recv().map_err(io::Error::other)?
}
