//! `AppState`: what every handler gets through axum's `State`, and how it is built from a
//! `Config` at start-up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use spillway_api::Digest;
use tokio::sync::Notify;

use crate::clock::Clock;
use crate::config::Config;
use crate::db::Db;
use crate::storage::BlobStore;

/// Shared by all handlers; one reference count to clone (axum clones it for every extractor).
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    /// The state of one server.
    pub fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What [`AppState`] holds.
pub struct Shared {
    /// Metadata: blobs, references, streams, tokens (SQLite or PostgreSQL).
    pub db: Db,
    /// Where blob bytes are stored: local disk or S3.
    pub blobs: BlobStore,
    /// Settings fixed at start-up.
    pub config: Arc<Config>,
    /// The clock every TTL, grace and lease is measured on (injected in tests).
    pub clock: Arc<dyn Clock>,
    /// Wakes long-polling readers of a stream appended on this replica; readers on other
    /// replicas notice the append by polling the database.
    pub stream_waiters: Arc<StreamWaiters>,
    /// Blob rows by digest: immutable, since they depend only on the content.
    pub blob_rows: Arc<BlobRowCache>,
    /// Visibility answers of this process, for the embedded (single-server) backend only.
    pub visibility: Arc<VisibilityCache>,
    /// Recently seen tokens, so that a request costs no database round trip to authenticate.
    pub token_cache: Arc<TokenCache>,
    /// Space kept back for deletes on a full disk (embedded store only).
    pub reserve: Arc<crate::storage::local::reserve::Reserve>,
    /// Blob text kept escaped for capped reads (`None`: disabled).
    pub(crate) text: Option<Arc<crate::blobs::text::TextCache>>,
    /// Capped reads answered from the text cache (tests show the path runs).
    pub escaped_pages: std::sync::atomic::AtomicU64,
    /// Capped reads answered before the router (`routes::read_before_router`).
    pub reads_before_router: std::sync::atomic::AtomicU64,
    /// How often uploads met retention deleting the same content (tests show the branches run).
    pub races: Arc<UploadRaces>,
    /// Seals the cursors handed to clients (opaque, bound to their namespace).
    pub cursors: crate::http::cursor::Cursors,
    /// Threads and limits for heavy scans (grep, search).
    pub heavy: Arc<crate::jobs::heavy::Heavy>,
    /// Finds the secrets a redacted read shows as marks (built-in kinds and `--redact-rules`).
    pub redactor: Arc<spillway_api::redact::Detector>,
    /// The secrets `redactor` found in blobs' blocks, for redacted capped reads.
    pub(crate) secrets: crate::blobs::secrets::SecretCache,
    /// Reads compacted blobs (their chunk lists and chunks, cached).
    pub chunks: Arc<crate::chunks::ChunkReader>,
}

/// Counts of the rare branches of the write path, per server.
#[derive(Debug, Default)]
pub struct UploadRaces {
    /// Uploads that found their content claimed by retention (`deleting`) and took it back.
    pub took_back: std::sync::atomic::AtomicU64,
    /// Uploads that published their bytes again after a deletion removed them.
    pub published_again: std::sync::atomic::AtomicU64,
}

impl UploadRaces {
    /// Adds one to a counter.
    pub fn count(counter: &std::sync::atomic::AtomicU64) {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl AppState {
    /// Now, in milliseconds.
    pub fn now(&self) -> i64 {
        self.clock.now_ms()
    }
}

/// Most tokens kept; the cache is emptied when it is full.
const TOKEN_CACHE_MAX: usize = 10_000;

/// A checked token: what it grants, and when it was checked.
type CheckedToken = (crate::db::TokenRow, std::time::Instant);

/// Tokens recently found in the database, by hash.
#[derive(Debug, Default)]
pub struct TokenCache {
    map: Mutex<HashMap<String, CheckedToken>>,
}

impl TokenCache {
    /// What a token checked less than `ttl` ago grants.
    pub fn get(&self, hash: &str, ttl: std::time::Duration) -> Option<crate::db::TokenRow> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get(hash).filter(|(_, at)| at.elapsed() < ttl).map(|(grant, _)| grant.clone())
    }

    /// Remembers a token just checked.
    pub fn put(&self, hash: String, grant: crate::db::TokenRow) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= TOKEN_CACHE_MAX {
            map.clear();
        }
        map.insert(hash, (grant, std::time::Instant::now()));
    }
}

/// One `Notify` per stream that has readers waiting.
#[derive(Default, Debug)]
pub struct StreamWaiters {
    map: Mutex<HashMap<String, Arc<Notify>>>,
}

impl StreamWaiters {
    /// The notifier of a stream, registered until the returned guard is dropped.
    pub fn get(self: &Arc<Self>, id: &str) -> Waiter {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let notify = map.entry(id.to_owned()).or_default().clone();
        Waiter { waiters: self.clone(), id: id.to_owned(), notify }
    }

    /// Wakes readers of `id`.
    pub fn wake(&self, id: &str) {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get(id) {
            n.notify_waiters();
        }
    }

    /// Whether a reader of `id` is registered (tests wait on this, not on time).
    pub fn is_waiting(&self, id: &str) -> bool {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).contains_key(id)
    }

    /// How many readers of `id` wait now (tests wait on this, not on time).
    pub fn waiting(&self, id: &str) -> usize {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get(id).map_or(0, |n| Arc::strong_count(n) - 1)
    }

    /// Streams with readers waiting (for tests: the map must not grow without bound).
    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// True when no reader waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A reader's registration; the last one of a stream to go removes the stream's notifier.
#[derive(Debug)]
pub struct Waiter {
    waiters: Arc<StreamWaiters>,
    id: String,
    notify: Arc<Notify>,
}

impl std::ops::Deref for Waiter {
    type Target = Notify;
    fn deref(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut map = self.waiters.map.lock().unwrap_or_else(|e| e.into_inner());
        // Held by the map and by this guard only: nobody else waits.
        if map.get(&self.id).is_some_and(|n| Arc::ptr_eq(n, &self.notify) && Arc::strong_count(n) == 2) {
            map.remove(&self.id);
        }
    }
}

/// Most blob rows kept; the cache is emptied when it is full.
const BLOB_ROWS_MAX: usize = 4096;

/// Blob rows (size, lines, line index) by digest. A digest names its content, so these never
/// change; only visibility, which is always asked of the database, and the layout of the
/// bytes (raw, then compacted; raw again if deleted and uploaded anew), which a read that
/// finds the bytes moved asks again (`store::blob_range`).
#[derive(Default, Debug)]
pub struct BlobRowCache {
    map: Mutex<HashMap<Digest, Arc<crate::db::BlobRow>>>,
}

impl BlobRowCache {
    /// The cached row of `digest`.
    pub fn get(&self, digest: &Digest) -> Option<Arc<crate::db::BlobRow>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).get(digest).cloned()
    }

    /// Forgets a row (its blob was deleted: the same content may come back laid out anew).
    pub fn forget(&self, digest: &Digest) {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).remove(digest);
    }

    /// Remembers a row.
    pub fn put(&self, row: Arc<crate::db::BlobRow>) {
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

/// Connects to the database (applying migrations) and opens the blob store.
pub async fn build_state(config: Config, clock: Arc<dyn Clock>) -> anyhow::Result<AppState> {
    private_files();
    tokio::fs::create_dir_all(&config.data_dir).await?;
    crate::storage::make_private(&config.data_dir).await?;
    let db = Db::connect(&config.database_url()).await?;
    let blobs =
        crate::storage::BlobStore::open(&config.blob_store_url(), &config.s3_options, config.read_cache_bytes).await?;
    let embedded = db.backend() == crate::db::Backend::Sqlite;
    let visibility = Arc::new(crate::state::VisibilityCache::new(embedded));
    let reserve = if embedded {
        crate::storage::local::reserve::Reserve::at(config.data_dir.join("space-reserve"), config.storage_reserve_bytes)
            .await
    } else {
        crate::storage::local::reserve::Reserve::none()
    };
    let cursors = crate::http::cursor::Cursors::new(&db.server_key("cursor").await?);
    let heavy = Arc::new(crate::jobs::heavy::Heavy::new(config.heavy_threads, config.max_heavy_requests)?);
    let redactor = Arc::new(redactor(config.redact_rules.as_deref()).await?);
    let chunks = Arc::new(crate::chunks::ChunkReader::new(config.read_cache_bytes));
    Ok(AppState::new(crate::state::Shared {
        redactor,
        secrets: crate::blobs::secrets::SecretCache::new(),
        chunks,
        text: crate::blobs::text::TextCache::new(config.text_cache_bytes).map(Arc::new),
        reserve: Arc::new(reserve),
        visibility,
        db,
        blobs,
        config: Arc::new(config),
        clock,
        stream_waiters: Default::default(),
        token_cache: Default::default(),
        blob_rows: Default::default(),
        races: Default::default(),
        heavy,
        cursors,
        escaped_pages: Default::default(),
        reads_before_router: Default::default(),
    }))
}

/// The secrets detector: the built-in kinds, and an operator's rules file when there is one.
async fn redactor(rules: Option<&std::path::Path>) -> anyhow::Result<spillway_api::redact::Detector> {
    use anyhow::Context;
    let text = match rules {
        Some(path) => tokio::fs::read_to_string(path)
            .await
            .with_context(|| format!("cannot read the redaction rules {}", path.display()))?,
        None => String::new(),
    };
    Ok(spillway_api::redact::Detector::with_rules(&text)?)
}

/// Everything this process writes from now on is readable by its own user alone: files
/// `0600`, directories `0700` (database, log, blobs, staged uploads, the token file).
fn private_files() {
    // SAFETY: umask changes only the process's file-mode creation mask; it cannot fail.
    unsafe { libc::umask(0o077) };
}
