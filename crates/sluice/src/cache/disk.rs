//! A cache's disk tier: one file per stored answer in a directory of its own, bounded in
//! bytes, found again after a hot restart or a process restart.
//!
//! * The index is a `moka` cache again: a key's variants on disk, weighed by their files'
//!   sizes against `max_size` (TinyLFU admission, LRU eviction); its eviction listener
//!   removes the files of what it evicts. It is rebuilt at start from the files' heads,
//!   oldest first ([`Disk::open`]).
//! * A file: `SLUICEC2`, the head's length (u32 LE), the head (key, status, times, fields,
//!   variant, the lifetime `valid` assigned it), the body, and a trailer: the body's length (u64 LE), the CRC-32 of head and body
//!   (u32 LE), `SLUICEND`. It is written while the answer streams to the client, to a
//!   temporary file (`tmp.<pid>.<name>`), and renamed to `<name>.obj` once the answer ended
//!   whole: a reader finds a whole file or none. A temporary file is removed when its answer
//!   fails or grows past `max_object`, and at start when the process that wrote it is gone
//!   (a crash).
//! * No fsync: a crashed process loses nothing it wrote (the data is the kernel's page
//!   cache's), and what a power loss may leave behind (a renamed file cut short, or with
//!   blocks of zeros) is caught on every read: a file whose lengths or checksum do not hold is
//!   removed and the request is a miss; it is never served.
//! * Open files: at most [`OPEN_FILES`] at once per tier. A miss that finds none free is not
//!   stored (it still streams to its client); a hit waits for one.
//! * Bytes in flight: an answer being stored holds [`WRITE_BUFFER`] bytes (its file's
//!   buffer), not its body; a hit read from disk holds its body (at most `max_object`) while
//!   it is served, and is kept in the memory tier after.
//! * Writes, the rename and evictions' removals run on the request's thread (page-cache
//!   writes, as NGINX's workers write their temporary files); reads run on tokio's blocking
//!   pool.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;
use moka::notification::RemovalCause;
use moka::ops::compute::Op;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use sluice_core::cache::{Stored, Variant};
use sluice_core::fields::Fields;

/// The most files a disk tier has open at once.
pub(super) const OPEN_FILES: usize = 64;
/// The buffer an answer being written goes through.
const WRITE_BUFFER: usize = 64 << 10;
/// The most variants a key keeps (as in memory).
const VARIANTS: usize = 16;
/// The longest head read back.
const MAX_HEAD: u64 = 1 << 20;
const MAGIC: &[u8; 8] = b"SLUICEC2";
const END: &[u8; 8] = b"SLUICEND";
/// Magic and the head's length.
const PREAMBLE: u64 = 12;
/// The body's length, the checksum and the end mark.
const TRAILER: u64 = 20;

/// One stored answer's file.
#[derive(Debug)]
pub(super) struct OnDisk {
    variant: Variant,
    path: PathBuf,
    size: u64,
}

/// A key's variants on disk, the newest first.
type Files = Arc<Vec<Arc<OnDisk>>>;

/// A cache's disk tier.
pub(super) struct Disk {
    dir: PathBuf,
    max_object: u64,
    index: moka::sync::Cache<String, Files>,
    open: Arc<Semaphore>,
    /// This process's names: `<generation>-<n>` (random, so no two processes' collide).
    generation: u64,
    next: AtomicU64,
    bytes: Gauge,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk")
            .field("dir", &self.dir)
            .field("entries", &self.index.entry_count())
            .finish_non_exhaustive()
    }
}

/// What a disk tier counts (its route's series).
pub(super) struct DiskCounters {
    pub(super) evictions: Counter,
    pub(super) bytes: Gauge,
}

impl Disk {
    /// The tier in `config.path` (created if missing), its index rebuilt from the files there.
    pub(super) fn open(
        config: &sluice_config::CacheDisk,
        max_object: u64,
        counters: DiskCounters,
    ) -> io::Result<Self> {
        fs::create_dir_all(&config.path)?;
        let evictions = counters.evictions;
        let index = moka::sync::Cache::builder()
            .max_capacity(config.max_size)
            .weigher(|_: &String, files: &Files| weight(files))
            .eviction_listener(move |_, files: Files, cause| {
                // A replaced list's dropped files are removed by whoever replaced it.
                if cause == RemovalCause::Replaced {
                    return;
                }
                if cause.was_evicted() {
                    evictions.inc();
                }
                files.iter().for_each(|f| remove(&f.path));
            })
            .build();
        let disk = Self {
            dir: config.path.clone(),
            max_object,
            index,
            open: Arc::new(Semaphore::new(OPEN_FILES)),
            generation: fastrand::u64(..),
            next: AtomicU64::new(0),
            bytes: counters.bytes,
        };
        disk.load()?;
        Ok(disk)
    }

    /// Indexes the files in the directory, oldest first; removes the ones cut short and the
    /// temporary files of processes that are gone.
    fn load(&self) -> io::Result<()> {
        let mut found = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if let Some(pid) = temporary_owner(name) {
                if !Path::new("/proc").join(pid.to_string()).exists() {
                    remove(&path);
                }
                continue;
            }
            if !name.ends_with(".obj") {
                continue;
            }
            match read_head(&path) {
                Ok(Some((modified, key, file))) => found.push((modified, key, file)),
                Ok(None) => remove(&path),
                Err(e) => tracing::debug!(file = %path.display(), error = %e, "cache file unread"),
            }
        }
        found.sort_by_key(|(modified, _, _)| *modified);
        for (_, key, file) in found {
            self.add(key, file);
        }
        self.settle();
        Ok(())
    }

    /// What it holds, for `/status`.
    pub(super) fn status(&self) -> sluice_config::admin::CacheDiskStatus {
        self.settle();
        sluice_config::admin::CacheDiskStatus {
            path: self.dir.display().to_string(),
            entries: self.index.entry_count(),
            stored_bytes: self.index.weighted_size(),
            max_size: self.index.policy().max_capacity().unwrap_or_default(),
        }
    }

    /// Brings the index's size (and its evictions) up to date and shows it.
    pub(super) fn settle(&self) {
        self.index.run_pending_tasks();
        let bytes = i64::try_from(self.index.weighted_size()).unwrap_or(i64::MAX);
        self.bytes.set(bytes);
    }

    /// Indexes `file` under `key`, over the variant it replaces.
    fn add(&self, key: String, file: OnDisk) {
        let file = Arc::new(file);
        let mut dropped = Vec::new();
        self.index.entry(key).and_compute_with(|old| {
            let mut files = vec![Arc::clone(&file)];
            for f in old.iter().flat_map(|e| e.value().iter()) {
                match f.variant != file.variant && files.len() < VARIANTS {
                    true => files.push(Arc::clone(f)),
                    false => dropped.push(Arc::clone(f)),
                }
            }
            Op::Put(Arc::new(files))
        });
        dropped.iter().for_each(|f| remove(&f.path));
    }

    /// Drops `file` of `key` from the index and the directory (it could not be read whole).
    fn forget(&self, key: &str, file: &Arc<OnDisk>) {
        self.index.entry(key.to_owned()).and_compute_with(|old| {
            let Some(old) = old else {
                return Op::Nop;
            };
            let kept = old.value().iter().filter(|f| !Arc::ptr_eq(f, file));
            let kept: Vec<_> = kept.cloned().collect();
            match kept.is_empty() {
                true => Op::Remove,
                false => Op::Put(Arc::new(kept)),
            }
        });
        remove(&file.path);
        self.settle();
    }

    /// The file of `key`'s variant for a request with these fields.
    pub(super) fn find(&self, key: &str, fields: &(impl Fields + ?Sized)) -> Option<Arc<OnDisk>> {
        let files = self.index.get(key)?;
        files.iter().find(|f| f.variant.matches(fields)).cloned()
    }

    /// `file` read back (`None`: gone, or cut short or corrupted, and now removed).
    pub(super) async fn read(&self, key: &str, file: Arc<OnDisk>) -> Option<Stored> {
        let permit = Arc::clone(&self.open).acquire_owned().await.ok()?;
        let (path, wanted, limit) = (file.path.clone(), key.to_owned(), self.max_object);
        let read = tokio::task::spawn_blocking(move || {
            let _open = permit;
            read_object(&path, &wanted, limit)
        });
        match read.await {
            Ok(Ok(Some(stored))) => Some(stored),
            Ok(Ok(None)) => {
                tracing::warn!(file = %file.path.display(), "cache file cut short or corrupted: removed");
                self.forget(key, &file);
                None
            }
            Ok(Err(e)) if e.kind() == io::ErrorKind::NotFound => {
                self.forget(key, &file);
                None
            }
            Ok(Err(e)) => {
                tracing::warn!(file = %file.path.display(), error = %e, "cache file unread");
                None
            }
            Err(_) => None,
        }
    }

    /// A file for `stored`'s answer to `key`, its body to follow (`None`: no file free, or it
    /// could not be made).
    pub(super) fn writer(&self, key: &str, stored: &Stored) -> Option<Writer> {
        let open = Arc::clone(&self.open).try_acquire_owned().ok()?;
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("{:016x}-{n:x}", self.generation);
        let temporary = self.dir.join(format!("tmp.{}.{name}", std::process::id()));
        let file = match File::create_new(&temporary) {
            Ok(file) => file,
            Err(e) => {
                tracing::warn!(file = %temporary.display(), error = %e, "cache file not written");
                return None;
            }
        };
        let mut writer = Writer {
            file: Some(BufWriter::with_capacity(WRITE_BUFFER, file)),
            temporary,
            path: self.dir.join(format!("{name}.obj")),
            crc: crc32fast::Hasher::new(),
            body: 0,
            _open: open,
        };
        let head = encode_head(key, stored);
        let length = u32::try_from(head.len()).ok()?;
        writer.put(MAGIC).ok()?;
        writer.put(&length.to_le_bytes()).ok()?;
        writer.crc.update(&head);
        writer.put(&head).ok()?;
        Some(writer)
    }

    /// Ends `writer`'s file and indexes it under `key` (nothing when it cannot be ended).
    pub(super) fn commit(&self, key: &str, variant: Variant, mut writer: Writer) {
        match writer.finish() {
            Ok(size) => {
                let path = writer.path.clone();
                self.add(
                    key.to_owned(),
                    OnDisk {
                        variant,
                        path,
                        size,
                    },
                );
                self.settle();
            }
            Err(e) => {
                tracing::warn!(file = %writer.temporary.display(), error = %e, "cache file not written");
            }
        }
    }

    /// Writes `stored` (a refreshed answer) whole under `key`.
    pub(super) fn put(&self, key: &str, stored: &Stored) {
        if let Some(mut writer) = self.writer(key, stored) {
            if writer.data(&stored.body) {
                self.commit(key, stored.variant.clone(), writer);
            }
        }
    }

    /// Removes `key`'s files; whether it had any.
    pub(super) fn remove(&self, key: &str) -> bool {
        let removed = self.index.remove(key).is_some();
        self.settle();
        removed
    }

    /// The keys that start with `prefix`.
    pub(super) fn keys_with(&self, prefix: &str) -> Vec<Arc<String>> {
        let keys = self.index.iter().filter(|(k, _)| k.starts_with(prefix));
        keys.map(|(k, _)| k).collect()
    }
}

/// An answer's file being written: removed unless it is renamed into place whole.
pub(super) struct Writer {
    file: Option<BufWriter<File>>,
    temporary: PathBuf,
    path: PathBuf,
    crc: crc32fast::Hasher,
    /// The body's bytes written.
    body: u64,
    _open: OwnedSemaphorePermit,
}

impl Writer {
    /// The body's bytes so far.
    pub(super) fn written(&self) -> u64 {
        self.body
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        let file = self.file.as_mut().ok_or(io::ErrorKind::BrokenPipe)?;
        file.write_all(bytes)
    }

    /// Appends a chunk of the body; false when it could not be written.
    pub(super) fn data(&mut self, chunk: &[u8]) -> bool {
        self.crc.update(chunk);
        self.body += chunk.len() as u64;
        match self.put(chunk) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(file = %self.temporary.display(), error = %e, "cache file not written");
                self.file = None;
                false
            }
        }
    }

    /// Writes the trailer and renames the file into place: its size.
    fn finish(&mut self) -> io::Result<u64> {
        let crc = self.crc.clone().finalize();
        let mut trailer = Vec::with_capacity(TRAILER as usize);
        trailer.extend_from_slice(&self.body.to_le_bytes());
        trailer.extend_from_slice(&crc.to_le_bytes());
        trailer.extend_from_slice(END);
        self.put(&trailer)?;
        let file = self.file.take().ok_or(io::ErrorKind::BrokenPipe)?;
        let file = file.into_inner().map_err(io::IntoInnerError::into_error)?;
        let size = file.metadata()?.len();
        drop(file);
        fs::rename(&self.temporary, &self.path)?;
        self.temporary = PathBuf::new();
        Ok(size)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if !self.temporary.as_os_str().is_empty() {
            drop(self.file.take());
            remove(&self.temporary);
        }
    }
}

/// What `files` weigh against `max_size`: their bytes.
fn weight(files: &Files) -> u32 {
    let bytes: u64 = files.iter().map(|f| f.size).sum();
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

fn remove(path: &Path) {
    if let Err(e) = fs::remove_file(path) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(file = %path.display(), error = %e, "cache file not removed");
        }
    }
}

/// The process that writes a temporary file named `tmp.<pid>.<name>`.
fn temporary_owner(name: &str) -> Option<u32> {
    name.strip_prefix("tmp.")?.split('.').next()?.parse().ok()
}

/// A file's head, checked against its length and trailer: when it was written, its key and
/// what the index keeps of it (`None`: not a whole file).
fn read_head(path: &Path) -> io::Result<Option<(SystemTime, String, OnDisk)>> {
    let mut file = File::open(path)?;
    let meta = file.metadata()?;
    let size = meta.len();
    let mut preamble = [0; PREAMBLE as usize];
    if size < PREAMBLE + TRAILER || file.read_exact(&mut preamble).is_err() {
        return Ok(None);
    }
    let length = u64::from(u32::from_le_bytes([
        preamble[8],
        preamble[9],
        preamble[10],
        preamble[11],
    ]));
    if preamble[..8] != MAGIC[..] || length > MAX_HEAD || PREAMBLE + length + TRAILER > size {
        return Ok(None);
    }
    let mut head = vec![0; length as usize];
    file.read_exact(&mut head)?;
    let mut trailer = [0; TRAILER as usize];
    file.seek(SeekFrom::End(-(TRAILER as i64)))?;
    file.read_exact(&mut trailer)?;
    let body = u64::from_le_bytes(trailer[..8].try_into().unwrap_or_default());
    if trailer[12..] != END[..] || PREAMBLE + length + body + TRAILER != size {
        return Ok(None);
    }
    let Some((key, stored)) = decode_head(&head) else {
        return Ok(None);
    };
    let modified = meta.modified().unwrap_or(UNIX_EPOCH);
    let path = path.to_owned();
    let variant = stored.variant;
    Ok(Some((
        modified,
        key,
        OnDisk {
            variant,
            path,
            size,
        },
    )))
}

/// The answer stored for `key` in the file at `path`, if it is whole: lengths, end mark and
/// checksum hold, and the key is the one asked for.
fn read_object(path: &Path, key: &str, max_object: u64) -> io::Result<Option<Stored>> {
    let size = fs::metadata(path)?.len();
    if size > PREAMBLE + MAX_HEAD + max_object + TRAILER {
        return Ok(None);
    }
    let bytes = Bytes::from(fs::read(path)?);
    Ok(decode_object(&bytes, key))
}

fn decode_object(bytes: &Bytes, key: &str) -> Option<Stored> {
    let size = bytes.len() as u64;
    if size < PREAMBLE + TRAILER || bytes[..8] != MAGIC[..] {
        return None;
    }
    let length = u64::from(u32::from_le_bytes(bytes[8..12].try_into().ok()?));
    let trailer = &bytes[(size - TRAILER) as usize..];
    let body = u64::from_le_bytes(trailer[..8].try_into().ok()?);
    let crc = u32::from_le_bytes(trailer[8..12].try_into().ok()?);
    let whole = PREAMBLE
        .checked_add(length)?
        .checked_add(body)?
        .checked_add(TRAILER)?;
    if trailer[12..] != END[..] || whole != size {
        return None;
    }
    let head_end = (PREAMBLE + length) as usize;
    let body_end = head_end + body as usize;
    if crc32fast::hash(&bytes[PREAMBLE as usize..body_end]) != crc {
        return None;
    }
    let (stored_key, mut stored) = decode_head(&bytes[PREAMBLE as usize..head_end])?;
    stored.body = bytes.slice(head_end..body_end);
    (stored_key == key).then_some(stored)
}

fn encode_head(key: &str, stored: &Stored) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    put_bytes(&mut out, key.as_bytes());
    out.extend_from_slice(&stored.status.as_u16().to_le_bytes());
    for time in [stored.request_time, stored.response_time] {
        put_duration(
            &mut out,
            time.duration_since(UNIX_EPOCH).unwrap_or_default(),
        );
    }
    out.extend_from_slice(&(stored.fields.len() as u32).to_le_bytes());
    for (name, value) in &stored.fields {
        put_bytes(&mut out, name.as_str().as_bytes());
        put_bytes(&mut out, value.as_bytes());
    }
    let pairs = stored.variant.pairs();
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (name, value) in pairs {
        put_bytes(&mut out, name.as_bytes());
        out.push(u8::from(value.is_some()));
        put_bytes(&mut out, value.as_deref().unwrap_or("").as_bytes());
    }
    out.push(u8::from(stored.assigned.is_some()));
    put_duration(&mut out, stored.assigned.unwrap_or_default());
    out
}

fn put_duration(out: &mut Vec<u8>, d: Duration) {
    out.extend_from_slice(&d.as_secs().to_le_bytes());
    out.extend_from_slice(&d.subsec_nanos().to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// A head's key and answer (with no body yet).
fn decode_head(head: &[u8]) -> Option<(String, Stored)> {
    let mut r = Reader(head);
    let key = String::from_utf8(r.bytes()?.to_vec()).ok()?;
    let status = StatusCode::from_u16(u16::from_le_bytes(r.take(2)?.try_into().ok()?)).ok()?;
    let mut times = [UNIX_EPOCH; 2];
    for time in &mut times {
        *time = UNIX_EPOCH.checked_add(r.duration()?)?;
    }
    let mut fields = HeaderMap::new();
    for _ in 0..r.u32()? {
        let name = HeaderName::from_bytes(r.bytes()?).ok()?;
        let value = HeaderValue::from_bytes(r.bytes()?).ok()?;
        fields.append(name, value);
    }
    let mut pairs = Vec::new();
    for _ in 0..r.u32()? {
        let name = String::from_utf8(r.bytes()?.to_vec()).ok()?;
        let present = r.take(1)?[0] == 1;
        let value = String::from_utf8(r.bytes()?.to_vec()).ok()?;
        pairs.push((name, present.then_some(value)));
    }
    let has_assigned = r.take(1)?[0] == 1;
    let assigned = r.duration()?;
    let stored = Stored {
        status,
        fields,
        body: Bytes::new(),
        variant: Variant::from_pairs(pairs),
        request_time: times[0],
        response_time: times[1],
        assigned: has_assigned.then_some(assigned),
    };
    r.0.is_empty().then_some((key, stored))
}

/// Reads a head's parts in order.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (taken, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(taken)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    /// A duration (u64 seconds, u32 nanoseconds below a second; `None` past that, as only a
    /// damaged head has).
    fn duration(&mut self) -> Option<Duration> {
        let secs = self.u64()?;
        let nanos = self.u32().filter(|n| *n < 1_000_000_000)?;
        Some(Duration::new(secs, nanos))
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn stored(body: &str) -> Stored {
        let mut fields = HeaderMap::new();
        fields.insert("cache-control", HeaderValue::from_static("max-age=60"));
        fields.append("x-two", HeaderValue::from_static("a"));
        fields.append("x-two", HeaderValue::from_static("b"));
        let variant = Variant::from_pairs(vec![
            ("accept-language".into(), Some("de".into())),
            ("accept".into(), None),
        ]);
        let now = SystemTime::now();
        let mut s = Stored::new(StatusCode::OK, &fields, variant, (now, now));
        s.body = Bytes::from(body.to_owned());
        s.assigned = Some(Duration::from_millis(600_250));
        s
    }

    fn disk(dir: &Path, max_size: u64) -> Disk {
        let config = sluice_config::CacheDisk {
            path: dir.to_owned(),
            max_size,
        };
        let counters = DiskCounters {
            evictions: Counter::default(),
            bytes: Gauge::default(),
        };
        Disk::open(&config, 1 << 20, counters).unwrap()
    }

    fn only_file(dir: &Path) -> PathBuf {
        let mut files = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path());
        let file = files.next().unwrap();
        assert!(files.next().is_none());
        file
    }

    #[tokio::test]
    async fn a_file_reads_back_as_it_was_written_and_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let key = "http://a.example/x";
        let written = stored("hello");
        disk(dir.path(), 1 << 20).put(key, &written);
        let again = disk(dir.path(), 1 << 20);
        let request: HeaderMap = [(
            HeaderName::from_static("accept-language"),
            HeaderValue::from_static("de"),
        )]
        .into_iter()
        .collect();
        let file = again.find(key, &request).unwrap();
        let read = again.read(key, file).await.unwrap();
        assert_eq!(read.body, "hello");
        assert_eq!(read.fields, written.fields);
        assert_eq!(read.variant, written.variant);
        assert_eq!(read.status, StatusCode::OK);
        assert_eq!(read.response_time, written.response_time);
        assert_eq!(read.assigned, written.assigned);
        assert!(
            again.find(key, &HeaderMap::new()).is_none(),
            "another variant"
        );
    }

    #[tokio::test]
    async fn a_file_cut_short_or_changed_is_never_read_back() {
        for damage in ["cut", "flip", "grow"] {
            let dir = tempfile::tempdir().unwrap();
            let key = "http://a.example/x";
            let written = disk(dir.path(), 1 << 20);
            written.put(key, &stored("some body bytes"));
            let path = only_file(dir.path());
            let mut bytes = fs::read(&path).unwrap();
            match damage {
                "cut" => bytes.truncate(bytes.len() - 3),
                "flip" => {
                    let at = bytes.len() - TRAILER as usize - 2;
                    bytes[at] ^= 1;
                }
                _ => bytes.push(0),
            }
            fs::write(&path, bytes).unwrap();
            // Read by the tier that wrote it (its index has the file), and after a restart.
            let file = written.find(key, &HeaderMap::new());
            let file = file.or_else(|| written.index.get(key).map(|f| Arc::clone(&f[0])));
            assert!(written.read(key, file.unwrap()).await.is_none(), "{damage}");
            assert!(!path.exists(), "{damage}: removed");
            written.put(key, &stored("again"));
            let path = only_file(dir.path());
            let mut bytes = fs::read(&path).unwrap();
            bytes.truncate(bytes.len() / 2);
            fs::write(&path, bytes).unwrap();
            let restarted = disk(dir.path(), 1 << 20);
            assert_eq!(restarted.index.entry_count(), 0, "{damage}");
            assert!(!path.exists(), "{damage}: removed at start");
        }
    }

    #[test]
    fn a_head_with_an_impossible_time_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let key = "http://a.example/x";
        disk(dir.path(), 1 << 20).put(key, &stored("body"));
        let path = only_file(dir.path());
        let mut bytes = fs::read(&path).unwrap();
        // The request time's seconds and nanoseconds, after the key and the status.
        let at = PREAMBLE as usize + 4 + key.len() + 2;
        bytes[at..at + 12].fill(0xff);
        fs::write(&path, bytes).unwrap();
        let restarted = disk(dir.path(), 1 << 20);
        assert_eq!(restarted.index.entry_count(), 0);
        assert!(!path.exists(), "removed at start");
    }

    #[test]
    fn a_dead_process_s_temporary_file_is_removed_at_start_a_live_one_s_kept() {
        let dir = tempfile::tempdir().unwrap();
        let ours = dir.path().join(format!("tmp.{}.1-0", std::process::id()));
        // PIDs are below 2^22 on Linux: this one never ran.
        let dead = dir.path().join("tmp.4294967295.1-0");
        fs::write(&ours, b"partial").unwrap();
        fs::write(&dead, b"partial").unwrap();
        drop(disk(dir.path(), 1 << 20));
        assert!(ours.exists());
        assert!(!dead.exists());
    }

    /// What a start costs: `cargo test -p sluice --lib -- --ignored --nocapture start_over`.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn start_over_ten_thousand_files() {
        let dir = tempfile::tempdir().unwrap();
        let tier = disk(dir.path(), 1 << 30);
        for i in 0..10_000 {
            tier.put(&format!("http://a.example/{i}"), &stored(&"x".repeat(4000)));
        }
        drop(tier);
        let started = std::time::Instant::now();
        let again = disk(dir.path(), 1 << 30);
        again.index.run_pending_tasks();
        let took = started.elapsed();
        println!(
            "indexed {} files (4 KB bodies) in {took:?}",
            again.index.entry_count()
        );
    }

    #[test]
    fn the_files_stay_within_max_size() {
        let dir = tempfile::tempdir().unwrap();
        let tier = disk(dir.path(), 4096);
        for i in 0..40 {
            tier.put(&format!("http://a.example/{i}"), &stored(&"x".repeat(300)));
        }
        let sizes = fs::read_dir(dir.path()).unwrap();
        let total: u64 = sizes.map(|e| e.unwrap().metadata().unwrap().len()).sum();
        assert!(total <= 4096, "{total}");
        assert!(tier.index.entry_count() >= 1);
    }
}
