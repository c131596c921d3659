//! Start-up and serving: build the state from a `Config`, create the first token, and serve
//! on a listener the caller bound (tests bind `127.0.0.1:0`) until a shutdown signal.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::{create_token, Scope};
use crate::blobs::BlobStore;
use crate::clock::Clock;
use crate::config::Config;
use crate::db::Db;
use crate::retention::run_retention;
use crate::routes::router;
use crate::state::AppState;

/// Connects to the database (applying migrations) and opens the blob store.
pub async fn build_state(config: Config, clock: Arc<dyn Clock>) -> anyhow::Result<AppState> {
    private_files();
    tokio::fs::create_dir_all(&config.data_dir).await?;
    crate::blobs::make_private(&config.data_dir).await?;
    let db = Db::connect(&config.database_url()).await?;
    let blobs = BlobStore::open(&config.blob_store_url(), &config.s3_options, config.read_cache_bytes).await?;
    crate::routes::install_metrics();
    let embedded = db.backend() == crate::db::Backend::Sqlite;
    let visibility = Arc::new(crate::state::VisibilityCache::new(embedded));
    let reserve = if embedded {
        crate::reserve::Reserve::at(config.data_dir.join("space-reserve"), config.storage_reserve_bytes).await
    } else {
        crate::reserve::Reserve::none()
    };
    let cursors = crate::cursor::Cursors::new(&db.server_key("cursor").await?);
    let heavy = Arc::new(crate::heavy::Heavy::new(config.heavy_threads, config.max_heavy_requests)?);
    let redactor = Arc::new(redactor(config.redact_rules.as_deref()).await?);
    let chunks = Arc::new(crate::chunks::ChunkReader::new(config.read_cache_bytes));
    Ok(AppState::new(crate::state::Shared {
        redactor,
        secrets: crate::cache::SecretCache::new(),
        chunks,
        text: crate::text::TextCache::new(config.text_cache_bytes).map(Arc::new),
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

/// On a first start (no tokens at all) creates an all-scopes token for namespace `default`
/// and writes it to `<data_dir>/token` with mode 0600. Returns the file when it did.
pub async fn ensure_first_token(state: &AppState) -> anyhow::Result<Option<PathBuf>> {
    if state.db.count_tokens().await? > 0 {
        return Ok(None);
    }
    let token = create_token(&state.db, "default", &[Scope::Read, Scope::Write, Scope::Admin], state.now()).await?;
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

/// Serves the operator's metrics (`GET /metrics`, Prometheus text) on a listener of its own
/// until `shutdown` completes.
pub async fn serve_metrics(
    listener: TcpListener,
    config: &Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    crate::routes::install_metrics();
    crate::listen::accept_loop(listener, crate::routes::metrics_router(), None, config, shutdown).await;
}

/// Serves until `shutdown` completes, running retention on its interval meanwhile. Each
/// connection is HTTP/1.1 with the configured header-read timeout (which also closes idle
/// kept-alive connections) and counts against `max_connections`.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let cancel = CancellationToken::new();
    let st = state.clone();
    tokio::spawn(async move { crate::retention::report_storage(&st).await });
    let retention = tokio::spawn(run_retention(state.clone(), state.config.retention_interval, cancel.clone()));
    let compaction =
        tokio::spawn(crate::compaction::run_compaction(state.clone(), state.config.compact_interval, cancel.clone()));
    let config = state.config.clone();
    crate::listen::accept_loop(listener, router(state.clone()), Some(state), &config, shutdown).await;
    cancel.cancel();
    let _ = retention.await;
    let _ = compaction.await;
    Ok(())
}
