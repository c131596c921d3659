//! The blob service handlers call: whether a namespace sees a blob and a stored blob as a
//! paging source (`source`), the write path shared by uploads and seals (`upload`), blob text
//! kept escaped for capped reads (`text`) and the secrets found in it (`secrets`), and what
//! this process remembers of blobs (`cache`). [`Blobs`] is the handle they all take.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use spillway_api::redact::Detector;

use crate::chunks::ChunkReader;
use crate::clock::Clock;
use crate::config::Config;
use crate::db::Db;
use crate::jobs::heavy::Heavy;
use crate::storage::local::reserve::Reserve;
use crate::storage::BlobStore;

pub(crate) mod cache;
pub mod damage;
pub mod refs;
pub(crate) mod secrets;
pub mod source;
pub(crate) mod text;
pub mod upload;

/// What the blob service works with; one reference count to clone.
#[derive(Clone)]
pub struct Blobs(Arc<Inner>);

impl std::ops::Deref for Blobs {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        &self.0
    }
}

/// What [`Blobs`] holds.
pub struct Inner {
    /// Blob rows and references.
    pub db: Db,
    /// Where blob bytes are stored: local disk or S3.
    pub store: BlobStore,
    /// Reads compacted blobs (their chunk lists and chunks, cached).
    pub chunks: Arc<ChunkReader>,
    /// The clock references' expiries are measured on.
    pub clock: Arc<dyn Clock>,
    /// Blob rows by digest: immutable, since they depend only on the content.
    pub rows: cache::BlobRowCache,
    /// Visibility answers of this process, for the embedded (single-server) backend only.
    pub visibility: cache::VisibilityCache,
    /// Blob text kept escaped for capped reads (`None`: disabled).
    pub(crate) text: Option<Arc<text::TextCache>>,
    /// Finds the secrets a redacted read shows as marks (built-in kinds and `--redact-rules`).
    pub redactor: Arc<Detector>,
    /// The secrets `redactor` found in blobs' blocks, for redacted capped reads.
    pub(crate) secrets: secrets::SecretCache,
    /// Pacing for downloads and scans beside requests.
    pub heavy: Arc<Heavy>,
    /// Space kept back for deletes on a full disk (embedded store only).
    pub reserve: Arc<Reserve>,
    /// Largest blob accepted, in bytes.
    pub max_blob_bytes: u64,
    /// Bytes one namespace may hold (`None`: no quota).
    pub namespace_quota_bytes: Option<u64>,
    /// Counts of rare branches and fast paths, per server (tests show the paths run).
    pub probes: Probes,
    /// Outputs whose stored bytes failed their hash: never read.
    pub damage: cache::Damage,
}

/// What [`Blobs::new`] is made from.
pub(crate) struct Parts<'a> {
    pub(crate) db: Db,
    pub(crate) store: BlobStore,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) heavy: Arc<Heavy>,
    pub(crate) redactor: Arc<Detector>,
    pub(crate) reserve: Arc<Reserve>,
    /// This process is the only writer (SQLite): its visibility answers may be cached.
    pub(crate) embedded: bool,
    pub(crate) config: &'a Config,
}

impl Blobs {
    /// The handle, with empty caches sized by `config`.
    pub(crate) fn new(p: Parts<'_>) -> Self {
        Self(Arc::new(Inner {
            db: p.db,
            store: p.store,
            chunks: Arc::new(ChunkReader::new(p.config.read_cache_bytes)),
            clock: p.clock,
            rows: Default::default(),
            visibility: cache::VisibilityCache::new(p.embedded),
            text: text::TextCache::new(p.config.text_cache_bytes).map(Arc::new),
            redactor: p.redactor,
            secrets: secrets::SecretCache::new(),
            heavy: p.heavy,
            reserve: p.reserve,
            max_blob_bytes: p.config.max_blob_bytes,
            namespace_quota_bytes: p.config.namespace_quota_bytes,
            probes: Probes::default(),
            damage: Default::default(),
        }))
    }

    /// Now, in milliseconds.
    pub fn now(&self) -> i64 {
        self.clock.now_ms()
    }
}

/// Per-server counts of paths that tests must see taken (the process-wide metrics cannot tell
/// one test's server from another's).
#[derive(Debug, Default)]
pub struct Probes {
    /// Uploads that found their content claimed by retention (`deleting`) and took it back.
    pub took_back: AtomicU64,
    /// Capped reads answered from the text cache.
    pub escaped_pages: AtomicU64,
    /// Capped reads answered before the router (`http::routes::answer_before_router`).
    pub reads_before_router: AtomicU64,
}

impl Probes {
    /// Adds one to a count.
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
