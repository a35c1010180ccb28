//! Buffers lent to fast-path connections while their bytes are in flight, as NGINX and HAProxy
//! lend theirs: a connection takes them when a request's first bytes arrive and gives them
//! back when it goes idle, so an idle keep-alive connection holds none (the client's buffer
//! goes back sooner still, once a small request is read: `conn::own_copy`). Each worker thread
//! keeps up to [`KEPT`] of each kind for its next requests, with the capacity they grew to, so
//! steady traffic allocates none of them (a small request's copy of its own bytes is the one
//! allocation it makes); beyond that a buffer given back is freed. Plain byte
//! vectors only: nothing tied to a runtime (a timer) moves between connections.

use std::cell::RefCell;

use sluice_core::read_ahead::IO_BUFFER_BYTES;

/// Buffers of each kind a thread keeps for its next requests: enough for the requests that
/// finish between two a busy worker begins, few enough to keep little once the load is gone.
pub(super) const KEPT: usize = 32;

/// A request's buffers besides the client's reads (the fields of a `Scratch`).
pub(super) type Set = [Vec<u8>; 5];

thread_local! {
    static READS: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    static SETS: RefCell<Vec<Set>> = const { RefCell::new(Vec::new()) };
}

/// A buffer for a client's bytes, empty, of [`IO_BUFFER_BYTES`] (how much of a request the
/// fast path reads ahead): one this thread kept, else a new one.
pub(super) fn read_buffer() -> Vec<u8> {
    READS
        .with_borrow_mut(Vec::pop)
        .unwrap_or_else(|| Vec::with_capacity(IO_BUFFER_BYTES))
}

/// Keeps `buf` (emptied) for the thread's next request, or frees it: also one that grew (bytes
/// the client pipelined appended), so that every buffer lent has the same room.
pub(super) fn give_read_buffer(mut buf: Vec<u8>) {
    if buf.capacity() == IO_BUFFER_BYTES {
        buf.clear();
        keep(&READS, buf);
    }
}

/// A request's set of buffers, empty: one this thread kept, else unallocated ones.
pub(super) fn set() -> Set {
    SETS.with_borrow_mut(Vec::pop).unwrap_or_default()
}

/// Keeps `set` (emptied) for the thread's next request, or frees it.
pub(super) fn give_set(mut set: Set) {
    set.iter_mut().for_each(Vec::clear);
    keep(&SETS, set);
}

/// How many buffers for clients' bytes this thread keeps.
#[cfg(test)]
pub(super) fn kept_read_buffers() -> usize {
    READS.with_borrow(Vec::len)
}

fn keep<T: 'static>(pool: &'static std::thread::LocalKey<RefCell<Vec<T>>>, item: T) {
    pool.with_borrow_mut(|kept| {
        if kept.len() < KEPT {
            kept.push(item);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_lent_again() {
        let mut buf = read_buffer();
        buf.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        let at = buf.as_ptr();
        give_read_buffer(buf);
        let again = read_buffer();
        assert!(again.is_empty());
        assert_eq!((again.as_ptr(), again.capacity()), (at, IO_BUFFER_BYTES));
    }

    #[test]
    fn a_thread_keeps_no_more_than_kept() {
        let bufs: Vec<_> = (0..KEPT + 8).map(|_| read_buffer()).collect();
        bufs.into_iter().for_each(give_read_buffer);
        assert_eq!(READS.with_borrow(Vec::len), KEPT);
    }
}
