//! Background passes, each a loop on a timer and a `_once` that tests call: retention
//! (expiry, grace, claimed deletions, orphan sweeps) and compaction (raw blobs into chunks and
//! packs), and the scrub (stored bytes checked against their hashes); and `heavy`, the pool and pacing that scans and passes share so that requests
//! keep their pace beside them.

pub mod compaction;
pub mod heavy;
pub mod retention;
pub mod scrub;

use std::sync::{Arc, Mutex};

use crate::blobs::Blobs;
use crate::config::Config;

/// What the passes work with: the blobs they delete and compact, and their settings.
#[derive(Clone)]
pub struct Jobs {
    /// Rows, bytes, chunk lists and the caches that remember them.
    pub blobs: Blobs,
    /// The passes' intervals, grace, leases and ages.
    pub config: Arc<Config>,
    /// Where retention's rolling walks go on from, pass after pass.
    pub(crate) rolling: Arc<Mutex<Rolling>>,
}

/// The places retention's bounded walks reached, so that the next pass takes the next part.
#[derive(Debug, Default)]
pub(crate) struct Rolling {
    /// The last blob `mark_unreferenced_page` looked at (empty: from the first).
    pub(crate) unreferenced_after: String,
    /// The next key prefix (of 256) the sweep for bytes with no row lists.
    pub(crate) next_prefix: usize,
}

impl Jobs {
    /// The handle.
    pub fn new(blobs: Blobs, config: Arc<Config>) -> Self {
        Self { blobs, config, rolling: Arc::default() }
    }

    /// Now, in milliseconds.
    pub fn now(&self) -> i64 {
        self.blobs.now()
    }
}
