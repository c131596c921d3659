//! Operations endpoints: liveness, readiness, Prometheus metrics and the OpenAPI document.
//! None of them needs a token.

use std::sync::OnceLock;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use utoipa::OpenApi;

use crate::state::AppState;

/// The OpenAPI 3 description of every `/v1` route, generated from the handlers.
#[derive(OpenApi)]
#[openapi(
    info(title = "Spillway store", description = "Content-addressed spill store for AI agents' tool outputs"),
    paths(
        super::blobs::put_blob,
        super::blobs::post_blob,
        super::blobs::head_blob,
        super::blobs::get_blob,
        super::blobs::pin_blob,
        super::blobs::unpin_blob,
        super::blobs::delete_blob,
        super::read::read_blob,
        super::read::grep_blob,
        super::refs::list_refs,
        super::streams::create_stream,
        super::streams::get_stream,
        super::streams::append_stream,
        super::streams::read_stream,
        super::streams::seal_stream,
    ),
    components(schemas(spillway_api::ErrorBody, spillway_api::ErrorCode, spillway_api::ErrorDetail))
)]
pub struct ApiDoc;

static PROMETHEUS: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the Prometheus recorder once per process (several servers may run in one test).
pub fn install_metrics() -> Option<&'static PrometheusHandle> {
    PROMETHEUS
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok().map(|_| handle)
        })
        .as_ref()
}

pub(super) async fn healthz() -> &'static str {
    "ok\n"
}

pub(super) async fn readyz(State(state): State<AppState>) -> Response {
    let db = state.db.ping().await;
    let blobs = state.blobs.ping().await;
    match (db, blobs) {
        (Ok(()), Ok(())) => (StatusCode::OK, "ready\n").into_response(),
        (db, blobs) => {
            tracing::warn!(db = ?db.err(), blobs = ?blobs.err(), "not ready");
            crate::error::ApiError::Unavailable("database or blob store unreachable".into()).into_response()
        }
    }
}

pub(super) async fn metrics() -> Response {
    let body = install_metrics().map(|h| h.render()).unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

pub(super) async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
