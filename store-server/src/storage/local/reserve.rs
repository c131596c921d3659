//! A space reserve for the embedded (SQLite + local disk) store: a file of real bytes kept
//! beside the database. When the disk fills up (any `507`), the reserve is released so that
//! deletes — which SQLite must write to its WAL — still work and an operator can free space
//! through the API; `/readyz` reports the store as full until the reserve can be written
//! again.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// The reserve and whether it is currently released.
#[derive(Debug)]
pub struct Reserve {
    path: Option<PathBuf>,
    size: u64,
    released: AtomicBool,
    /// When a write last tried to restore the reserve, so that writes on a full disk do not
    /// each write (and delete) two reserves' worth of bytes.
    last_try: std::sync::Mutex<Option<std::time::Instant>>,
}

/// Writes refused on a full disk try to restore the reserve at most this often.
const RETRY_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

impl Reserve {
    /// No reserve (PostgreSQL, S3: their space is their servers' business).
    pub fn none() -> Self {
        Self { path: None, size: 0, released: AtomicBool::new(false), last_try: Default::default() }
    }

    /// A reserve of `size` bytes at `path`, written now if it is missing; a disk already too
    /// full for it starts released (and not ready).
    pub async fn at(path: PathBuf, size: u64) -> Self {
        let this = Self { path: Some(path), size, released: AtomicBool::new(true), last_try: Default::default() };
        this.restore().await;
        this
    }

    /// True while the reserve is released: the store ran out of space.
    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    /// Frees the reserve (idempotent); returns whether it freed space now.
    pub fn release(&self) -> bool {
        let Some(path) = &self.path else {
            return false;
        };
        if self.released.swap(true, Ordering::SeqCst) {
            return false;
        }
        tracing::error!(path = %path.display(), "storage is full: space reserve released so that deletes can proceed");
        std::fs::remove_file(path).is_ok()
    }

    /// Whether a write may go ahead: not while the reserve is released and cannot be restored
    /// (tried at most every few seconds), so the space left goes to deletes.
    pub async fn admits_writes(&self) -> bool {
        if !self.is_released() {
            return true;
        }
        let due = {
            let mut last = self.last_try.lock().unwrap_or_else(|e| e.into_inner());
            let due = last.is_none_or(|t| t.elapsed() >= RETRY_EVERY);
            if due {
                *last = Some(std::time::Instant::now());
            }
            due
        };
        due && self.restore().await
    }

    /// Writes the reserve again if there is room for it twice over (so that a disk that is
    /// still nearly full stays reported full); true when it is in place.
    pub async fn restore(&self) -> bool {
        let Some(path) = self.path.clone() else {
            return true;
        };
        if !self.is_released() {
            return true;
        }
        let size = self.size;
        let written = tokio::task::spawn_blocking(move || {
            // The slack file is written first and removed last: both must fit at once.
            let slack = path.with_extension("slack");
            let written = write_reserve(&slack, size).and_then(|()| write_reserve(&path, size));
            let _ = std::fs::remove_file(&slack);
            if written.is_err() {
                let _ = std::fs::remove_file(&path);
            }
            written
        })
        .await;
        match written {
            Ok(Ok(())) => {
                self.released.store(false, Ordering::SeqCst);
                true
            }
            _ => false,
        }
    }
}

fn write_reserve(path: &std::path::Path, size: u64) -> std::io::Result<()> {
    use std::io::Write;
    if std::fs::metadata(path).is_ok_and(|m| m.len() == size) {
        return Ok(());
    }
    let tmp = path.with_extension("writing");
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        let chunk = vec![0u8; 1 << 20];
        let mut left = size;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            f.write_all(&chunk[..n])?; // real bytes: a sparse file would reserve nothing
            left -= n as u64;
        }
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
