//! The server's one configuration. Every field maps to a flag and an environment variable
//! (see `Opts` in `main.rs`); defaults are the embedded single-machine setup.

use std::path::PathBuf;
use std::time::Duration;

/// Everything the server needs to know at start-up.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the SQLite database, the blob directory and the first-start token live.
    pub data_dir: PathBuf,
    /// `sqlite://…` or `postgres://…`; `None` means `sqlite://<data_dir>/spillway.db`.
    pub database_url: Option<String>,
    /// `file:///path` or `s3://bucket/prefix`; `None` means `file://<data_dir>/blobs`.
    pub blob_store: Option<String>,
    /// S3 settings given here rather than in the `AWS_*` environment (object_store's keys,
    /// e.g. `aws_endpoint`); they take precedence over it.
    pub s3_options: Vec<(String, String)>,
    /// Largest blob an upload may carry.
    pub max_blob_bytes: u64,
    /// TTL of a reference when the upload names none.
    pub default_ttl: Duration,
    /// Longest TTL an upload may ask for.
    pub max_ttl: Duration,
    /// Default and maximum `max_bytes` of a stream.
    pub max_stream_bytes: u64,
    /// How often the server runs a retention pass.
    pub retention_interval: Duration,
    /// How long unreferenced bytes are kept before they are deleted.
    pub retention_grace: Duration,
    /// After this long, a deletion that a crashed pass left half-done is finished by the next.
    pub deletion_lease: Duration,
    /// Of the 256 key prefixes under which blobs (and packs) are stored, how many a retention
    /// pass lists for bytes that have no row (a crash's leftovers), taking the next ones each
    /// pass: a pass lists a sixteenth of the store by default, and a round takes 16 passes.
    pub sweep_prefixes: usize,
    /// A client must send a request's whole header within this long, on a new connection and
    /// between requests of a kept-alive one: idle and trickling connections are closed.
    pub header_read_timeout: Duration,
    /// An upload or append whose body sends nothing for this long is dropped (and what it
    /// staged is removed).
    pub body_idle_timeout: Duration,
    /// A response the client takes nothing of for this long (its socket's buffers full) ends
    /// its connection, as nginx's `send_timeout`: a client that asks for a large body and never
    /// reads it does not hold a connection slot.
    pub send_idle_timeout: Duration,
    /// Most connections served at once; more wait in the listen queue.
    pub max_connections: usize,
    /// Bytes of the space reserve kept beside an embedded (SQLite) database; at least what
    /// SQLite needs to fold its log into the database (1,000 pages, 4 MiB), with room to spare.
    pub storage_reserve_bytes: u64,
    /// How long a replica trusts a token it has checked: a revoked token is refused by every
    /// replica within this long.
    pub token_cache_ttl: Duration,
    /// How often a long-poll looks at the database for appends made through other replicas
    /// (appends through this one wake it at once).
    pub stream_poll_interval: Duration,
    /// Bytes of blob blocks an S3-backed server keeps in memory for reads (a blob never
    /// changes, so they never go stale); below 256 KiB, none.
    pub read_cache_bytes: u64,
    /// Bytes of blob text kept JSON-escaped in memory, from which capped reads of plain text
    /// are answered without reading or escaping them again; below 64 KiB, none.
    pub text_cache_bytes: u64,
    /// Most streams a namespace may have open at once (`429 too_many_requests` past it).
    pub max_open_streams: u64,
    /// Most bytes a namespace may hold (distinct live blobs it references, plus its open
    /// streams); `None`: no quota. Past it, uploads and appends are `507 quota_exceeded`.
    pub namespace_quota_bytes: Option<u64>,
    /// Threads that run heavy scans (grep, search), apart from the ones that answer requests.
    pub heavy_threads: usize,
    /// Heavy requests (grep, search) run or queued at once; past it `429 too_many_requests`.
    pub max_heavy_requests: usize,
    /// How long one grep or search request scans before it answers with where to go on.
    pub search_budget: Duration,
    /// An operator's own kinds of secret, in gitleaks' TOML rule format, added to the built-in
    /// ones for every redacted read (`--redact-rules`).
    pub redact_rules: Option<PathBuf>,
    /// Raw blobs written longer ago than this are compacted into chunks.
    pub compact_after: Duration,
    /// How often the server runs a compaction pass.
    pub compact_interval: Duration,
    /// Time the background scrub takes to check everything stored, a 24th at a time
    /// (`Duration::ZERO`: no background scrub).
    pub scrub_interval: Duration,
    /// How long a server holds the compaction lease without renewing it (it renews it with
    /// every blob): after a crash, the next compaction starts within this long.
    pub compaction_lease: Duration,
}

impl Config {
    /// The embedded default rooted at `data_dir`; a relative directory is taken from the
    /// working directory now, so the URLs built from it are absolute.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        let data_dir = data_dir.into();
        Self {
            data_dir: std::path::absolute(&data_dir).unwrap_or(data_dir),
            database_url: None,
            blob_store: None,
            s3_options: Vec::new(),
            max_blob_bytes: 1 << 30,
            default_ttl: Duration::from_secs(7 * 24 * 3600),
            max_ttl: Duration::from_secs(90 * 24 * 3600),
            max_stream_bytes: 50 << 20,
            retention_interval: Duration::from_secs(3600),
            retention_grace: Duration::from_secs(3600),
            deletion_lease: Duration::from_secs(300),
            sweep_prefixes: 16,
            token_cache_ttl: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(30),
            body_idle_timeout: Duration::from_secs(60),
            send_idle_timeout: Duration::from_secs(60),
            max_connections: 1024,
            storage_reserve_bytes: 16 << 20,
            stream_poll_interval: Duration::from_millis(100),
            read_cache_bytes: 256 << 20,
            text_cache_bytes: 256 << 20,
            max_open_streams: 1000,
            namespace_quota_bytes: None,
            heavy_threads: std::thread::available_parallelism().map_or(2, |n| (n.get() / 2).max(2)),
            max_heavy_requests: 16,
            search_budget: Duration::from_millis(1000),
            redact_rules: None,
            compact_after: Duration::from_secs(300),
            compact_interval: Duration::from_secs(60),
            scrub_interval: Duration::from_secs(86_400),
            compaction_lease: Duration::from_secs(120),
        }
    }

    /// The database URL in force.
    pub fn database_url(&self) -> String {
        self.database_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}?mode=rwc", self.data_dir.join("spillway.db").display()))
    }

    /// The blob store URL in force.
    pub fn blob_store_url(&self) -> String {
        self.blob_store.clone().unwrap_or_else(|| {
            let dir = self.data_dir.join("blobs");
            url::Url::from_file_path(&dir).map_or_else(|()| format!("file://{}", dir.display()), String::from)
        })
    }
}
