//! Background passes, each a loop on a timer and a `_once` that tests call: retention
//! (expiry, grace, claimed deletions, orphan sweeps) and compaction (raw blobs into chunks and
//! packs), and the scrub (stored bytes checked against their hashes); and `heavy`, the pool and pacing that scans and passes share so that requests
//! keep their pace beside them.

pub mod compaction;
pub mod heavy;
pub mod retention;
pub mod scrub;

use std::sync::Arc;

use crate::blobs::Blobs;
use crate::config::Config;

/// What the passes work with: the blobs they delete and compact, and their settings.
#[derive(Clone)]
pub struct Jobs {
    /// Rows, bytes, chunk lists and the caches that remember them.
    pub blobs: Blobs,
    /// The passes' intervals, grace, leases and ages.
    pub config: Arc<Config>,
}

impl Jobs {
    /// The handle.
    pub fn new(blobs: Blobs, config: Arc<Config>) -> Self {
        Self { blobs, config }
    }

    /// Now, in milliseconds.
    pub fn now(&self) -> i64 {
        self.blobs.now()
    }
}
