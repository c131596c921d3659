//! What this process remembers of blobs: their rows (immutable, since a digest names its
//! content), on the embedded backend only which namespace sees which blob until when, and
//! which outputs are marked damaged (`blobs/damage.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use spillway_api::Digest;

use crate::db::BlobRow;
use crate::storage::BlobError;

/// Most blob rows kept; the cache is emptied when it is full.
const BLOB_ROWS_MAX: usize = 4096;

/// Blob rows (size, lines, line index) by digest. A digest names its content, so these never
/// change; only visibility, which is always asked of the database, and the layout of the
/// bytes (raw, then compacted; raw again if deleted and uploaded anew), which a read that
/// finds the bytes moved asks again (`store::blob_range`).
#[derive(Default, Debug)]
pub struct BlobRowCache {
    map: Mutex<HashMap<Digest, Arc<BlobRow>>>,
}

impl BlobRowCache {
    /// The cached row of `digest`.
    pub fn get(&self, digest: &Digest) -> Option<Arc<BlobRow>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).get(digest).cloned()
    }

    /// Forgets a row (its blob was deleted: the same content may come back laid out anew).
    pub fn forget(&self, digest: &Digest) {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).remove(digest);
    }

    /// Remembers a row.
    pub fn put(&self, row: Arc<BlobRow>) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= BLOB_ROWS_MAX {
            map.clear();
        }
        map.insert(row.digest, row);
    }
}

/// How long a visibility answer is reused (it is also dropped at the reference's expiry, and
/// at once when this server deletes or unpins).
const VISIBILITY_TTL: std::time::Duration = std::time::Duration::from_secs(10);

/// `(namespace, digest)` → until when the namespace sees the blob. Used only where this
/// process is the only writer (SQLite), so its own deletes are all the invalidation needed.
#[derive(Default, Debug)]
pub struct VisibilityCache {
    enabled: bool,
    map: Mutex<HashMap<(String, Digest), (i64, std::time::Instant)>>,
}

impl VisibilityCache {
    /// A cache that answers only when `enabled`.
    pub fn new(enabled: bool) -> Self {
        Self { enabled, map: Mutex::default() }
    }

    /// Whether it answers at all (the embedded backend).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// A cached "visible" answer still good at `now`.
    pub fn visible(&self, ns: &str, digest: &Digest, now: i64) -> bool {
        if !self.enabled {
            return false;
        }
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&(ns.to_owned(), *digest)).is_some_and(|(until, at)| *until > now && at.elapsed() < VISIBILITY_TTL)
    }

    /// Remembers that `ns` sees `digest` until `until`.
    pub fn remember(&self, ns: &str, digest: &Digest, until: i64) {
        if !self.enabled {
            return;
        }
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= BLOB_ROWS_MAX * 4 {
            map.clear();
        }
        map.insert((ns.to_owned(), *digest), (until, std::time::Instant::now()));
    }

    /// Forgets what `ns` saw of `digest` (after a delete or an unpin).
    pub fn forget(&self, ns: &str, digest: &Digest) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(&(ns.to_owned(), *digest));
    }
}

/// The marked outputs, by digest.
#[derive(Debug, Default)]
pub struct Damage {
    marked: RwLock<HashSet<Digest>>,
}

impl Damage {
    /// Whether `d` is marked.
    pub fn contains(&self, d: &Digest) -> bool {
        let marked = self.marked.read().unwrap_or_else(|e| e.into_inner());
        !marked.is_empty() && marked.contains(d)
    }

    /// `Err(Corrupt)` when `d` is marked: what every read asks first.
    pub fn check(&self, d: &Digest) -> Result<(), BlobError> {
        if self.contains(d) {
            return Err(BlobError::Corrupt(*d));
        }
        Ok(())
    }

    pub(crate) fn set(&self, d: Digest, marked: bool) {
        let mut set = self.marked.write().unwrap_or_else(|e| e.into_inner());
        if marked {
            set.insert(d);
        } else {
            set.remove(&d);
        }
    }
}

impl Damage {
    /// Takes `now` as the whole set; gives the digests newly marked.
    pub(crate) fn replace(&self, now: HashSet<Digest>) -> Vec<Digest> {
        let mut set = self.marked.write().unwrap_or_else(|e| e.into_inner());
        let added: Vec<Digest> = now.difference(&set).copied().collect();
        *set = now;
        added
    }
}
