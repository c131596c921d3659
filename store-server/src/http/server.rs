//! Serving: the API on a listener the caller bound (tests bind `127.0.0.1:0`) until a
//! shutdown signal, with the background passes beside it; the operator's metrics on another.

use std::future::Future;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::http::routes::router;
use crate::jobs::retention::run_retention;
use crate::state::AppState;

/// Serves the operator's metrics (`GET /metrics`, Prometheus text) on a listener of its own
/// until `shutdown` completes.
pub async fn serve_metrics(
    listener: TcpListener,
    config: &Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    crate::http::routes::install_metrics();
    crate::http::listen::accept_loop(listener, crate::http::routes::metrics_router(), None, config, shutdown).await;
}

/// Serves until `shutdown` completes, running retention on its interval meanwhile. Each
/// connection is HTTP/1.1 with the configured header-read timeout (which also closes idle
/// kept-alive connections) and counts against `max_connections`.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::http::routes::install_metrics();
    let cancel = CancellationToken::new();
    let st = state.clone();
    tokio::spawn(async move { crate::jobs::retention::report_storage(&st.jobs).await });
    let scrub =
        tokio::spawn(crate::jobs::scrub::run_scrub(state.jobs.clone(), state.config.scrub_interval, cancel.clone()));
    let damage = tokio::spawn(crate::blobs::damage::refresh_damage(state.blobs.clone(), cancel.clone()));
    let retention = tokio::spawn(run_retention(state.jobs.clone(), state.config.retention_interval, cancel.clone()));
    let compaction = tokio::spawn(crate::jobs::compaction::run_compaction(
        state.jobs.clone(),
        state.config.compact_interval,
        cancel.clone(),
    ));
    let config = state.config.clone();
    crate::http::listen::accept_loop(listener, router(state.clone()), Some(state), &config, shutdown).await;
    cancel.cancel();
    let _ = retention.await;
    let _ = damage.await;
    let _ = scrub.await;
    let _ = compaction.await;
    Ok(())
}
