//! A TUN device: `open("/dev/net/tun")` + `ioctl(TUNSETIFF)`, the one call without a safe
//! wrapper in the crates this project uses.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;

/// `struct ifreq` as TUNSETIFF reads it: the name, the flags, padding to 40 bytes.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Creates the TUN device `name` (IP packets, no packet-info header) in the caller's network
/// namespace; the device lives as long as the returned file.
pub(crate) fn create(name: &str) -> io::Result<File> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "bad interface name",
        ));
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: the fd is open for the call's duration (owned by `file`); `req` is a valid,
    // NUL-terminated `ifreq` of the size the kernel reads and writes for TUNSETIFF.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req as *mut IfReq) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}
