//! [`HandoffListener`]: the socket file consumers connect to, and who may connect.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::io::Errno;
use rustix::net::{
    accept_with, bind, listen, socket_with, AddressFamily, SocketAddrUnix, SocketFlags, SocketType,
};
use tokio::io::Interest;
use tokio::net::UnixDatagram;

use crate::error::Error;
use crate::socket::register;
use crate::socket::{Credentials, Handoff};

/// The mode of the socket file unless the caller asks for another: owner only.
pub const DEFAULT_SOCKET_MODE: u32 = 0o600;

/// How many connections may wait for [`HandoffListener::accept`].
const BACKLOG: i32 = 128;

/// Who may open a handoff socket file: its permission bits and its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketAccess {
    /// The file's permission bits; [`DEFAULT_SOCKET_MODE`] (owner only) by default.
    pub mode: u32,
    /// The file's group (a gid); `None` (the default) leaves the process's own.
    pub group: Option<u32>,
}

impl Default for SocketAccess {
    fn default() -> Self {
        Self {
            mode: DEFAULT_SOCKET_MODE,
            group: None,
        }
    }
}

/// Which peer uids may use a handoff socket: the owner's (by default our own euid) always,
/// and any others listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedUids {
    owner: u32,
    others: Vec<u32>,
}

impl Default for AllowedUids {
    /// Our own euid only.
    fn default() -> Self {
        Self::new([])
    }
}

impl AllowedUids {
    /// Our own euid and these uids.
    pub fn new(others: impl IntoIterator<Item = u32>) -> Self {
        Self::for_owner(rustix::process::geteuid().as_raw(), others)
    }

    /// `owner` and these uids: as [`AllowedUids::new`] for a process whose peers' owner is
    /// not its own euid.
    pub fn for_owner(owner: u32, others: impl IntoIterator<Item = u32>) -> Self {
        Self {
            owner,
            others: others.into_iter().collect(),
        }
    }

    /// Whether a peer with `uid` may connect.
    pub fn allows(&self, uid: u32) -> bool {
        uid == self.owner || self.others.contains(&uid)
    }

    /// [`Error::PeerNotAllowed`] unless the peer's uid is allowed.
    pub fn check(&self, peer: &Credentials) -> Result<(), Error> {
        if self.allows(peer.uid) {
            Ok(())
        } else {
            Err(Error::PeerNotAllowed {
                uid: peer.uid,
                pid: peer.pid,
            })
        }
    }
}

/// A listening handoff socket bound to a path. Dropping it removes the socket file, unless
/// another process has since replaced it.
#[derive(Debug)]
pub struct HandoffListener {
    /// The listening socket, registered for readiness only (see [`Handoff`]'s field).
    sock: UnixDatagram,
    path: PathBuf,
    /// `(st_dev, st_ino)` of the file we created, to recognise it at drop.
    file: (u64, u64),
}

impl HandoffListener {
    /// Binds and listens at `path`, the file getting `mode` (usually [`DEFAULT_SOCKET_MODE`])
    /// and the process's own group: [`HandoffListener::bind_with`].
    pub fn bind(path: impl AsRef<Path>, mode: u32) -> Result<Self, Error> {
        Self::bind_with(path, SocketAccess { mode, group: None })
    }

    /// Binds and listens at `path`, the file getting `access`'s mode and group.
    ///
    /// The socket is bound inside a fresh owner-only directory, given its group and mode, and
    /// only then linked at `path`, so the file is never accessible with looser permissions,
    /// whatever the umask. A group the process may not give ([`Error::Group`]) fails the bind.
    /// A socket file nobody listens on (left by a crash) is replaced; a live one gives
    /// [`Error::InUse`], anything else at `path` [`Error::NotASocket`]. Needs a tokio runtime;
    /// `path` plus about 16 bytes must fit in `sun_path` (108 bytes).
    pub fn bind_with(path: impl AsRef<Path>, access: SocketAccess) -> Result<Self, Error> {
        let path = path.as_ref();
        remove_stale(path)?;
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let private = tempfile::Builder::new().prefix(".hs").tempdir_in(parent)?;
        let staged = private.path().join("s");
        let (fd, meta) = listen_at(&staged, access)?;
        // link(2) never replaces: if another process bound `path` since we looked, we lose.
        fs::hard_link(&staged, path).map_err(|e| match e.kind() {
            io::ErrorKind::AlreadyExists => Error::InUse(path.to_owned()),
            _ => Error::Io(e),
        })?;
        Ok(Self {
            sock: register(fd, SocketType::SEQPACKET)?,
            path: path.to_owned(),
            file: (meta.dev(), meta.ino()),
        })
    }

    /// The path the listener is bound to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits for the next connection and returns it with its peer's credentials. Does not
    /// check them: see [`HandoffListener::accept_allowed`].
    pub async fn accept(&self) -> Result<(Handoff, Credentials), Error> {
        let flags = SocketFlags::CLOEXEC | SocketFlags::NONBLOCK;
        let accept = || Ok(accept_with(&self.sock, flags)?);
        let fd = self.sock.async_io(Interest::READABLE, accept).await?;
        let handoff = Handoff::from_fd(fd)?;
        let peer = handoff.peer_credentials()?;
        Ok((handoff, peer))
    }

    /// [`HandoffListener::accept`], then [`Error::PeerNotAllowed`] (the connection closed) if
    /// the peer's uid is not in `allowed`. The listener stays usable: log and accept again.
    pub async fn accept_allowed(
        &self,
        allowed: &AllowedUids,
    ) -> Result<(Handoff, Credentials), Error> {
        let (handoff, peer) = self.accept().await?;
        allowed.check(&peer)?;
        Ok((handoff, peer))
    }
}

impl Drop for HandoffListener {
    fn drop(&mut self) {
        // A new process may have replaced a stale-looking file with its own: leave that one.
        // (Between this check and the unlink another replacement could slip in; a restart
        // that races its predecessor's exit by microseconds is not worth a lock file.)
        if let Ok(meta) = fs::symlink_metadata(&self.path) {
            if (meta.dev(), meta.ino()) == self.file {
                let _ = fs::remove_file(&self.path);
            }
        }
    }
}

/// A listening socket at `path` (in a private directory) whose file has `access`.
fn listen_at(path: &Path, access: SocketAccess) -> Result<(OwnedFd, fs::Metadata), Error> {
    let fd = bound_at(path)?;
    if let Some(gid) = access.group {
        std::os::unix::fs::chown(path, None, Some(gid))
            .map_err(|source| Error::Group { gid, source })?;
    }
    fs::set_permissions(path, fs::Permissions::from_mode(access.mode & 0o777))?;
    listen(&fd, BACKLOG).map_err(io::Error::from)?;
    Ok((fd, fs::symlink_metadata(path)?))
}

/// A socket bound at `path`, not listening yet.
fn bound_at(path: &Path) -> io::Result<OwnedFd> {
    let fd = socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    bind(&fd, &SocketAddrUnix::new(path)?)?;
    Ok(fd)
}

/// Makes way for a new socket at `path`: nothing there is fine, a dead socket (of any type,
/// e.g. left by a process that crashed) is removed, a live socket or a non-socket is refused.
pub fn remove_stale(path: &Path) -> Result<(), Error> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if !meta.file_type().is_socket() {
        return Err(Error::NotASocket(path.to_owned()));
    }
    if is_live(path)? {
        return Err(Error::InUse(path.to_owned()));
    }
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

/// Whether a process listens on the socket file at `path` (it will see one connection that
/// closes at once). A socket of another type listening there counts as live.
fn is_live(path: &Path) -> io::Result<bool> {
    let probe = socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    match rustix::net::connect(&probe, &SocketAddrUnix::new(path)?) {
        Ok(()) | Err(Errno::AGAIN | Errno::PROTOTYPE) => Ok(true),
        Err(Errno::CONNREFUSED | Errno::NOENT) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
