//! Operations endpoints: liveness, readiness, Prometheus metrics and the OpenAPI document.
//! None of them needs a token.

use std::sync::OnceLock;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::state::AppState;

static PROMETHEUS: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Latency buckets, in seconds: histograms, unlike summaries, add up across replicas and
/// never fall to 0 between scrapes.
const LATENCY_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// Buckets of [`db::GROUP_WRITES`](crate::db::GROUP_WRITES), a count of writes.
const GROUP_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// The counters the README tells operators to watch, with their help text. Each is present
/// from the start, at zero, so a dashboard never confuses "no events" with "no data".
const COUNTERS: &[(&str, &str)] = &[
    ("spillway_bytes_in_total", "Bytes received in uploads and stream appends."),
    ("spillway_bytes_out_total", "Bytes sent in downloads and read pages."),
    ("spillway_dedup_hits_total", "Uploads whose bytes were already stored."),
    ("spillway_read_capped_total", "Read pages cut short by the 100,000-byte cap."),
    (
        "spillway_read_escaped_pages_total",
        "Read pages written from blob text kept escaped in memory (--text-cache-bytes).",
    ),
    ("spillway_retention_expired_refs_total", "References removed by retention because they expired."),
    ("spillway_retention_deleted_blobs_total", "Blobs whose bytes retention deleted."),
    ("spillway_retention_freed_bytes_total", "Bytes retention freed."),
    ("spillway_scrub_checked_bytes_total", "Stored bytes the scrub read and checked against their hashes."),
    ("spillway_scrub_corrupt_total", "Outputs the scrub found failing their hash or missing."),
    ("spillway_corrupt_found_total", "Outputs marked damaged, by a read, a download or the scrub."),
];

/// Installs the Prometheus recorder once per process (several servers may run in one test).
pub fn install_metrics() -> Option<&'static PrometheusHandle> {
    PROMETHEUS
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(LATENCY_BUCKETS)
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(crate::db::GROUP_WRITES.into()), GROUP_BUCKETS))
                .expect("the bucket lists are not empty")
                .build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok()?;
            for (name, help) in COUNTERS {
                metrics::describe_counter!(*name, metrics::Unit::Count, *help);
                metrics::counter!(*name).absolute(0);
            }
            for (name, help) in [
                (
                    "spillway_stored_bytes",
                    "Bytes the store holds: raw blobs not yet compacted, and live packs of chunks.",
                ),
                ("spillway_logical_bytes", "Bytes of the live blobs, each distinct blob once."),
            ] {
                metrics::describe_gauge!(name, metrics::Unit::Bytes, help);
                metrics::gauge!(name).set(0.0);
            }
            metrics::describe_counter!("spillway_http_requests_total", "HTTP requests by method, route and status.");
            metrics::describe_gauge!(
                "spillway_retention_pass_seconds",
                metrics::Unit::Seconds,
                "How long this server's last retention pass took."
            );
            metrics::describe_gauge!(
                "spillway_scrub_last_complete_timestamp_seconds",
                metrics::Unit::Seconds,
                "When the background scrub last finished checking everything stored (Unix time)."
            );
            metrics::describe_histogram!(
                crate::db::GROUP_WRITES,
                metrics::Unit::Count,
                "Writes each SQLite group commit made durable together."
            );
            metrics::describe_histogram!(
                crate::db::GROUP_SECONDS,
                metrics::Unit::Seconds,
                "Time of one SQLite group commit: its writes' statements and the COMMIT (one fsync)."
            );
            metrics::describe_histogram!(
                "spillway_http_request_duration_seconds",
                metrics::Unit::Seconds,
                "Time to answer an HTTP request (to the response head; bodies stream after)."
            );
            Some(handle)
        })
        .as_ref()
}

pub(super) async fn healthz() -> &'static str {
    "ok\n"
}

pub(super) async fn readyz(State(state): State<AppState>) -> Response {
    if state.reserve.is_released() && !state.reserve.restore().await {
        return crate::error::ApiError::Unavailable("storage is full: free space (DELETE, retention) and retry".into())
            .into_response();
    }
    let db = state.db.ping().await;
    let blobs = state.blobs.store.ping().await;
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
