//! `Spool`: an upload's temporary file, written on a thread of its own while the body is still
//! arriving. Chunks go to the thread as they are (no copy), several at a time in one `writev`;
//! every [`WRITEBACK_STEP`] bytes the kernel is told to start writing them to the disk
//! (`sync_file_range`), so that the final `fdatasync` waits for the last step only instead of
//! the whole body.

use std::fs::File;
use std::io::{IoSlice, Write};
use std::path::Path;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Unwritten bytes the kernel is asked to write back at a time.
const WRITEBACK_STEP: u64 = 512 << 10;
/// Chunks waiting for the thread; the receiving task waits when they are this many. A chunk
/// is what one socket read gave (hyper reads at most ~400 KiB at once), so one upload holds at
/// most a few MiB here however large its body, as the `BufWriter` it replaced did.
const QUEUED_CHUNKS: usize = 8;
/// Chunks given to one `writev`.
const CHUNKS_PER_WRITE: usize = 64;

/// A new file being written by its own thread.
pub(crate) struct Spool {
    tx: mpsc::Sender<Bytes>,
    /// `None` once its end has been awaited (after a failed write).
    thread: Option<JoinHandle<std::io::Result<u64>>>,
}

impl Spool {
    /// Creates the file at `path` (which must not exist) and starts its writer.
    pub(crate) async fn create(path: &Path) -> std::io::Result<Self> {
        let path = path.to_owned();
        let file = tokio::task::spawn_blocking(move || File::options().write(true).create_new(true).open(path))
            .await
            .map_err(std::io::Error::other)??;
        let (tx, rx) = mpsc::channel(QUEUED_CHUNKS);
        let thread = tokio::task::spawn_blocking(move || write_all(file, rx));
        Ok(Self { tx, thread: Some(thread) })
    }

    /// Queues a chunk. An error means the thread stopped: the cause is in [`Spool::finish`].
    pub(crate) async fn write(&mut self, chunk: Bytes) -> std::io::Result<()> {
        if chunk.is_empty() {
            return Ok(());
        }
        match self.tx.send(chunk).await {
            Ok(()) => Ok(()),
            // The thread is gone, so it failed: its error is the one to report.
            Err(_) => Err(self.stopped().await),
        }
    }

    /// Writes what is queued and makes the file durable (`fdatasync`); returns its size.
    pub(crate) async fn finish(self) -> std::io::Result<u64> {
        let Self { tx, thread } = self;
        drop(tx);
        match thread {
            Some(thread) => thread.await.map_err(std::io::Error::other)?,
            None => Err(std::io::Error::other("the file writer failed")),
        }
    }

    /// Stops writing and waits for the thread to close the file.
    pub(crate) async fn abort(self) {
        let Self { tx, thread } = self;
        drop(tx);
        if let Some(thread) = thread {
            thread.abort(); // not started yet: never starts; running: ends as the queue closed
            let _ = thread.await;
        }
    }

    async fn stopped(&mut self) -> std::io::Error {
        match self.thread.take() {
            Some(thread) => match thread.await {
                Ok(Err(e)) => e,
                Ok(Ok(_)) => std::io::Error::other("the file writer stopped early"),
                Err(e) => std::io::Error::other(e),
            },
            None => std::io::Error::other("the file writer failed"),
        }
    }
}

/// The writer thread: everything queued, in order, then `fdatasync`.
fn write_all(mut file: File, mut rx: mpsc::Receiver<Bytes>) -> std::io::Result<u64> {
    let mut batch = Vec::with_capacity(CHUNKS_PER_WRITE);
    let (mut written, mut started) = (0u64, 0u64);
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < CHUNKS_PER_WRITE {
            match rx.try_recv() {
                Ok(chunk) => batch.push(chunk),
                Err(_) => break,
            }
        }
        written += write_batch(&mut file, &batch)?;
        batch.clear();
        if written - started >= WRITEBACK_STEP {
            start_writeback(&file, started, written - started);
            started = written;
        }
    }
    file.sync_data()?;
    Ok(written)
}

/// Writes every chunk of `batch`, through as few `writev` calls as the kernel allows.
fn write_batch(file: &mut File, batch: &[Bytes]) -> std::io::Result<u64> {
    let mut slices: Vec<IoSlice<'_>> = batch.iter().map(|b| IoSlice::new(b)).collect();
    let mut left = &mut slices[..];
    let mut total = 0u64;
    while !left.is_empty() {
        match file.write_vectored(left) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                total += n as u64;
                IoSlice::advance_slices(&mut left, n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(total)
}

/// Asks the kernel to start writing `len` bytes at `offset` to the disk, without waiting.
/// Only an early start: durability comes from the final `fdatasync`, so a refusal is ignored.
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else { return };
    // SAFETY: the descriptor is open for the duration of the call (borrowed from `file`);
    // sync_file_range reads no memory of ours.
    let _ = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE) };
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _offset: u64, _len: u64) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn chunks_arrive_in_order_and_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool");
        let mut spool = Spool::create(&path).await.unwrap();
        let mut expected = Vec::new();
        for i in 0..2_000u32 {
            let chunk = Bytes::from(i.to_le_bytes().repeat(i as usize % 97 + 1));
            expected.extend_from_slice(&chunk);
            spool.write(chunk).await.unwrap();
        }
        spool.write(Bytes::new()).await.unwrap();
        assert_eq!(spool.finish().await.unwrap(), expected.len() as u64);
        assert!(expected.len() as u64 > 2 * WRITEBACK_STEP / 8);
        assert_eq!(std::fs::read(&path).unwrap(), expected);
    }

    #[tokio::test]
    async fn an_existing_file_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("taken");
        std::fs::write(&path, b"keep").unwrap();
        let err = Spool::create(&path).await.err().unwrap();
        assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&path).unwrap(), b"keep");
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_full_disk_is_reported_by_write_or_finish() {
        // /dev/full takes the open and refuses every write with ENOSPC.
        let file = File::options().write(true).open("/dev/full").unwrap();
        let (tx, rx) = mpsc::channel(QUEUED_CHUNKS);
        let mut spool = Spool { tx, thread: Some(tokio::task::spawn_blocking(move || write_all(file, rx))) };
        let mut failed = None;
        for _ in 0..QUEUED_CHUNKS * 4 {
            if let Err(e) = spool.write(Bytes::from_static(&[7; 4096])).await {
                failed = Some(e);
                break;
            }
        }
        let err = match failed {
            Some(e) => e,
            None => spool.finish().await.unwrap_err(),
        };
        assert_eq!(err.kind(), std::io::ErrorKind::StorageFull);
    }
}
