//! The buffers large record reads fill, lent out as [`Bytes`] and given back to the store's
//! pool when the last record or frame sliced from one is dropped, on whatever thread that
//! happens.
//!
//! Why: a fan-out cursor reads a slab on one thread and drops its records on another once they
//! are committed. A buffer of megabytes allocated and zeroed per read, then freed on another
//! thread, went back to the system and was faulted in again by the next read: in the fan-out
//! bench (4 -> 12) the zeroing's page faults were more than half the copy's page faults and
//! about 5% of its CPU, which the raw loop, reading and dropping on one thread, hardly paid.
//! A lent buffer comes back as it is and is read into again without being zeroed: a read
//! overwrites every byte it hands out, and an error gives the buffer back unseen.

use std::io;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::log::lock;

/// Reads smaller than this are not lent from the pool: a small buffer comes cheaply from the
/// allocator, and a large pooled one lent for a few kilobytes would stay pinned by them.
pub(crate) const SMALLEST_LENT_BYTES: usize = 512 * 1024;
/// Idle buffers a store keeps for its logs.
const BUFFERS_KEPT: usize = 8;
/// Largest buffer kept: one grown for a larger frame is freed when its records are dropped.
/// With [`BUFFERS_KEPT`], at most 32 MiB idle per store, about 16 MiB with the 2 MiB frames
/// of a produce batch of 16,384 small records.
const LARGEST_KEPT_BYTES: usize = 4 * 1024 * 1024;

/// A store's idle read buffers, shared by all its logs: at most [`BUFFERS_KEPT`] of at most
/// [`LARGEST_KEPT_BYTES`] each while idle; while busy, one per read whose records are alive.
#[derive(Debug, Default)]
pub(crate) struct ReadBuffers {
    free: Mutex<Vec<Vec<u8>>>,
}

impl ReadBuffers {
    /// `len` bytes read by `read` into a buffer from the pool (or a new one), as [`Bytes`]
    /// that give the buffer back to the pool once they and every slice of them are dropped.
    pub(crate) fn read(
        self: &Arc<Self>,
        len: usize,
        read: impl FnOnce(&mut [u8]) -> io::Result<()>,
    ) -> io::Result<Bytes> {
        let mut buf = self.take(len);
        // Only a buffer shorter than the read grows (and only the new part is zeroed): the
        // bytes of an earlier read beyond `len` are never part of what is handed out.
        if buf.len() < len {
            buf.resize(len, 0);
        }
        match read(&mut buf[..len]) {
            Ok(()) => Ok(Bytes::from_owner(Lent {
                buf,
                pool: Arc::clone(self),
            })
            .slice(..len)),
            Err(e) => {
                self.give(buf);
                Err(e)
            }
        }
    }

    /// The idle buffer that fits `len` most tightly, else the largest (it grows least), else
    /// a new one: a small read does not pin a much larger buffer while one that fits is idle.
    fn take(&self, len: usize) -> Vec<u8> {
        let mut free = lock(&self.free);
        let fitting = (free.iter().enumerate())
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len());
        let pick = fitting
            .or_else(|| free.iter().enumerate().max_by_key(|(_, b)| b.len()))
            .map(|(i, _)| i);
        pick.map(|i| free.swap_remove(i)).unwrap_or_default()
    }

    /// Keeps `buf` for the next read, or frees it when enough are kept or it is too large.
    fn give(&self, buf: Vec<u8>) {
        if buf.capacity() > LARGEST_KEPT_BYTES {
            return;
        }
        let mut free = lock(&self.free);
        if free.len() < BUFFERS_KEPT {
            free.push(buf);
        }
    }

    /// Idle buffers now (for tests).
    #[cfg(test)]
    fn idle(&self) -> usize {
        lock(&self.free).len()
    }
}

/// A buffer lent out; back to its pool on drop.
struct Lent {
    buf: Vec<u8>,
    pool: Arc<ReadBuffers>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill_with(byte: u8) -> impl FnOnce(&mut [u8]) -> io::Result<()> {
        move |b| {
            b.fill(byte);
            Ok(())
        }
    }

    #[test]
    fn a_buffer_comes_back_when_the_last_slice_is_dropped_and_is_read_into_again() {
        let pool = Arc::new(ReadBuffers::default());
        let first = pool.read(1000, fill_with(1)).unwrap();
        let slice = first.slice(10..20);
        drop(first);
        assert_eq!(pool.idle(), 0, "a slice still holds it");
        drop(slice);
        assert_eq!(pool.idle(), 1);
        // Reused for a shorter read: only the bytes read are handed out.
        let second = pool.read(300, fill_with(2)).unwrap();
        assert_eq!(pool.idle(), 0);
        assert_eq!(second.len(), 300);
        assert!(second.iter().all(|&b| b == 2));
        drop(second);
        // And for a longer one.
        let third = pool.read(5000, fill_with(3)).unwrap();
        assert_eq!(third.len(), 5000);
        assert!(third.iter().all(|&b| b == 3));
    }

    #[test]
    fn a_read_takes_the_idle_buffer_that_fits_it_most_tightly() {
        let pool = Arc::new(ReadBuffers::default());
        let (small, large) = (
            pool.read(1_000, fill_with(1)).unwrap(),
            pool.read(100_000, fill_with(1)).unwrap(),
        );
        let (small_at, large_at) = (small.as_ptr(), large.as_ptr());
        drop((small, large));
        let read = pool.read(900, fill_with(2)).unwrap();
        assert_eq!(read.as_ptr(), small_at);
        let read = pool.read(50_000, fill_with(2)).unwrap();
        assert_eq!(read.as_ptr(), large_at);
    }

    #[test]
    fn a_failed_read_gives_its_buffer_back_and_hands_nothing_out() {
        let pool = Arc::new(ReadBuffers::default());
        let failed = pool.read(100, |_| Err(io::Error::other("device gone")));
        assert!(failed.is_err());
        assert_eq!(pool.idle(), 1);
    }

    #[test]
    fn the_pool_keeps_a_bounded_number_of_buffers_and_none_too_large() {
        let pool = Arc::new(ReadBuffers::default());
        let lent: Vec<Bytes> = (0..BUFFERS_KEPT + 3)
            .map(|_| pool.read(64, fill_with(0)).unwrap())
            .collect();
        drop(lent);
        assert_eq!(pool.idle(), BUFFERS_KEPT);
        let pool = Arc::new(ReadBuffers::default());
        drop(pool.read(LARGEST_KEPT_BYTES + 1, fill_with(0)).unwrap());
        assert_eq!(pool.idle(), 0);
    }
}
