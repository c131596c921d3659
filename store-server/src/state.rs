//! `AppState`: the bundle of service handles the router holds, and how it is built from a
//! `Config` at start-up. Handlers hand each service the handle it uses (`state.blobs`,
//! `state.streams`, …); no service takes the whole state.

use std::sync::Arc;

use crate::auth::Tokens;
use crate::blobs::Blobs;
use crate::clock::Clock;
use crate::config::Config;
use crate::db::Db;
use crate::http::cursor::Cursors;
use crate::jobs::heavy::Heavy;
use crate::jobs::Jobs;
use crate::search::Search;
use crate::storage::local::reserve::Reserve;
use crate::streams::Streams;

/// Shared by all handlers; one reference count to clone (axum clones it for every extractor).
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What [`AppState`] holds: the services' handles, and what the edge itself uses.
pub struct Shared {
    /// Settings fixed at start-up.
    pub config: Arc<Config>,
    /// Metadata, for the handlers of references and operations (SQLite or PostgreSQL).
    pub db: Db,
    /// The clock every TTL, grace and lease is measured on (injected in tests).
    pub clock: Arc<dyn Clock>,
    /// Authenticates requests.
    pub tokens: Tokens,
    /// Blobs: visibility, reads, uploads.
    pub blobs: Blobs,
    /// Background tasks' output.
    pub streams: Streams,
    /// Search across a namespace's outputs.
    pub search: Search,
    /// Retention and compaction passes.
    pub jobs: Jobs,
    /// Seals the cursors handed to clients (opaque, bound to their namespace).
    pub cursors: Cursors,
    /// Space kept back for deletes on a full disk (embedded store only).
    pub reserve: Arc<Reserve>,
    /// Threads and limits for heavy work (grep, search, downloads, passes).
    pub heavy: Arc<Heavy>,
}

impl AppState {
    /// Now, in milliseconds.
    pub fn now(&self) -> i64 {
        self.clock.now_ms()
    }
}

/// Connects to the database (applying migrations), opens the blob store and makes every
/// service's handle.
pub async fn build_state(config: Config, clock: Arc<dyn Clock>) -> anyhow::Result<AppState> {
    private_files();
    tokio::fs::create_dir_all(&config.data_dir).await?;
    crate::storage::make_private(&config.data_dir).await?;
    let db = Db::connect(&config.database_url()).await?;
    let store =
        crate::storage::BlobStore::open(&config.blob_store_url(), &config.s3_options, config.read_cache_bytes).await?;
    let embedded = db.backend() == crate::db::Backend::Sqlite;
    let reserve = if embedded {
        Reserve::at(config.data_dir.join("space-reserve"), config.storage_reserve_bytes).await
    } else {
        Reserve::none()
    };
    let cursors = Cursors::new(&db.server_key("cursor").await?);
    let heavy = Arc::new(Heavy::new(config.heavy_threads, config.max_heavy_requests)?);
    let redactor = Arc::new(redactor(config.redact_rules.as_deref()).await?);
    let config = Arc::new(config);
    let reserve = Arc::new(reserve);
    let blobs = Blobs::new(crate::blobs::Parts {
        reserve: reserve.clone(),
        db: db.clone(),
        store,
        clock: clock.clone(),
        heavy: heavy.clone(),
        redactor,
        embedded,
        config: &config,
    });
    Ok(AppState(Arc::new(Shared {
        tokens: Tokens::new(db.clone(), config.token_cache_ttl, clock.clone()),
        streams: Streams::new(blobs.clone(), &config),
        search: Search::new(blobs.clone(), cursors.clone(), &config),
        jobs: Jobs::new(blobs.clone(), config.clone()),
        blobs,
        reserve,
        db,
        config,
        clock,
        heavy,
        cursors,
    })))
}

/// On a first start (no tokens at all) creates an all-scopes token for namespace `default`
/// and writes it to `<data_dir>/token` with mode 0600. Returns the file when it did.
pub async fn ensure_first_token(state: &AppState) -> anyhow::Result<Option<std::path::PathBuf>> {
    if state.db.count_tokens().await? > 0 {
        return Ok(None);
    }
    let token = crate::auth::create_token(
        &state.db,
        "default",
        &[crate::auth::Scope::Read, crate::auth::Scope::Write, crate::auth::Scope::Admin],
        state.now(),
    )
    .await?;
    let path = state.config.data_dir.join("token");
    write_private(&path, format!("{token}\n").as_bytes())?;
    tracing::info!(path = %path.display(), namespace = "default", "first start: created a token with all scopes");
    Ok(Some(path))
}

fn write_private(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(data)?;
    f.sync_all()
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
