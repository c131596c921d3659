//! `/v1/blobs`: upload, head, download with Range, pin, delete.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::{StreamExt, TryStreamExt};
use spillway_api::{AnyDigest, BlobRecord, PinRequest};

use super::extract::{json_object_body, parse_digest, RefOptions, Q};
use crate::auth::{Caller, Scope};
use crate::blobs::refs;
use crate::blobs::source::visible;
use crate::blobs::upload::{self, RefSpec};
use crate::clock::rfc3339;
use crate::db::BlobRow;
use crate::error::{ApiError, ApiResult};
use crate::jobs::heavy::Heavy;
use crate::state::AppState;

fn check_length(headers: &HeaderMap, state: &AppState) -> ApiResult<()> {
    let max = state.config.max_blob_bytes;
    let len = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    match len {
        Some(n) if n > max => Err(ApiError::TooLarge(max)),
        _ => Ok(()),
    }
}

async fn upload_response(
    state: &AppState,
    caller: &Caller,
    expected: Option<AnyDigest>,
    pairs: Vec<(String, String)>,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    caller.require(Scope::Write)?;
    let opts = RefOptions::parse(pairs, false)?;
    let spec = RefSpec {
        namespace: caller.namespace.clone(),
        labels: opts.labels.clone(),
        ttl_ms: Some(opts.ttl_ms(&state.config)?),
    };
    check_length(headers, state)?;
    let hint = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
    let stored = upload::store(&state.blobs, expected, &spec, body.into_data_stream(), hint).await?;
    let status = if stored.record.deduplicated { StatusCode::OK } else { StatusCode::CREATED };
    let location = format!("/v1/blobs/{}", stored.record.digest);
    let mut resp = (status, Json(stored.record)).into_response();
    if let Ok(v) = HeaderValue::from_str(&location) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    Ok(resp)
}

/// `PUT /v1/blobs/{digest}`: stores the body if it hashes to `digest`.
#[utoipa::path(put, path = "/v1/blobs/{digest}", params(("digest" = String, Path, description = "blake3:… or sha256:…")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, body = BlobRecord), (status = 200, body = BlobRecord), (status = 400, body = spillway_api::ErrorBody)))]
pub(super) async fn put_blob(
    State(state): State<AppState>,
    caller: Caller,
    Path(raw): Path<String>,
    Q(pairs): Q<Vec<(String, String)>>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let expected = parse_digest(&raw)?;
    upload_response(&state, &caller, Some(expected), pairs, &headers, body).await
}

/// `POST /v1/blobs`: stores the body under whatever it hashes to.
#[utoipa::path(post, path = "/v1/blobs", request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, body = BlobRecord), (status = 200, body = BlobRecord)))]
pub(super) async fn post_blob(
    State(state): State<AppState>,
    caller: Caller,
    Q(pairs): Q<Vec<(String, String)>>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    upload_response(&state, &caller, None, pairs, &headers, body).await
}

fn etag(row: &BlobRow) -> String {
    format!("\"{}\"", row.digest)
}

fn base_headers(row: &BlobRow) -> [(header::HeaderName, String); 5] {
    [
        (header::ETAG, etag(row)),
        (header::ACCEPT_RANGES, "bytes".into()),
        (header::CONTENT_TYPE, "application/octet-stream".into()),
        // A browser must never take stored bytes for HTML or script.
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff".into()),
        (header::HeaderName::from_static("x-spillway-sha256"), row.sha256.to_string()),
    ]
}

/// `HEAD /v1/blobs/{digest}`.
#[utoipa::path(head, path = "/v1/blobs/{digest}", params(("digest" = String, Path)), responses((status = 200), (status = 404)))]
pub(super) async fn head_blob(
    State(state): State<AppState>,
    caller: Caller,
    Path(raw): Path<String>,
) -> ApiResult<Response> {
    caller.require(Scope::Read)?;
    let d = parse_digest(&raw)?;
    let row = visible(&state.blobs, &caller.namespace, &d).await?;
    let mut resp = (StatusCode::OK, base_headers(&row)).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(row.size));
    // The rest of the blob record, for `spillway stat` and other tools: lines, and when this
    // namespace's last reference expires (absent while it is pinned).
    h.insert(HeaderName::from_static("x-spillway-lines"), HeaderValue::from(row.lines));
    let until = state.db.visible_until(&caller.namespace, &row.digest, state.now()).await?;
    if let Some(ms) = until.filter(|&t| t != i64::MAX) {
        let v = HeaderValue::from_str(&rfc3339(ms)).map_err(ApiError::internal)?;
        h.insert(HeaderName::from_static("x-spillway-expires-at"), v);
    }
    Ok(resp)
}

fn if_none_match(headers: &HeaderMap, row: &BlobRow) -> bool {
    let tag = etag(row);
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .any(|v| v == "*" || v == tag || v.strip_prefix("W/") == Some(tag.as_str()))
}

fn parse_range(headers: &HeaderMap, size: u64) -> ApiResult<Option<std::ops::Range<u64>>> {
    let Some(raw) = headers.get(header::RANGE) else {
        return Ok(None);
    };
    // A Range that is not understood (another unit, a malformed spec) is ignored and the whole
    // blob is sent, as RFC 9110 §14.2 says and as S3 does.
    let Ok(raw) = raw.to_str() else {
        return Ok(None);
    };
    let Ok(parsed) = http_range_header::parse_range_header(raw) else {
        return Ok(None);
    };
    let unsatisfiable = || ApiError::RangeNotSatisfiable {
        message: format!("range {raw:?} is outside the blob ({size} bytes)"),
        size: Some(size),
    };
    let ranges = parsed.validate(size).map_err(|_| unsatisfiable())?;
    match ranges.as_slice() {
        [one] => Ok(Some(*one.start()..one.end() + 1)),
        _ => Ok(None), // several ranges: answer with the whole blob, as RFC 9110 allows
    }
}

/// A download larger than this gives way to requests as heavy work does ([`Heavy::pause_for`]).
const GIVES_WAY_FROM: u64 = 16 << 20;
/// Bytes sent between two looks at whether requests came meanwhile.
const GIVE_WAY_EVERY: usize = 1 << 20;

/// The body of a download of `len` bytes: past [`GIVES_WAY_FROM`], after each
/// [`GIVE_WAY_EVERY`] bytes sent, it rests twice as long as it took to send them when other
/// requests began meanwhile, the rests shared with searches and compaction. Alone it streams
/// at full speed; beside capped reads and uploads, two downloads of 1 GiB took both cores and
/// made their p99 4.8-10.6x and 2.9-3.9x what it was without them (`bench/run-heavy.sh`).
fn giving_way<S, E>(heavy: Arc<Heavy>, len: u64, body: S) -> impl futures::Stream<Item = Result<bytes::Bytes, E>>
where
    S: futures::Stream<Item = Result<bytes::Bytes, E>>,
{
    let (mut pace, mut sent) = (heavy.pace(), 0usize);
    body.then(move |chunk| {
        let pause = match &chunk {
            Ok(b) if len > GIVES_WAY_FROM => {
                sent += b.len();
                if sent < GIVE_WAY_EVERY {
                    None
                } else {
                    sent = 0;
                    heavy.pause_for(&mut pace)
                }
            }
            _ => None,
        };
        async move {
            if let Some(pause) = pause {
                tokio::time::sleep(pause).await;
            }
            chunk
        }
    })
}

/// `GET /v1/blobs/{digest}`: the whole blob, streamed; one `Range` honoured.
#[utoipa::path(get, path = "/v1/blobs/{digest}", params(("digest" = String, Path)),
    responses((status = 200), (status = 206), (status = 304), (status = 404, body = spillway_api::ErrorBody), (status = 416, body = spillway_api::ErrorBody)))]
pub(super) async fn get_blob(
    State(state): State<AppState>,
    caller: Caller,
    Path(raw): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller.require(Scope::Read)?;
    let d = parse_digest(&raw)?;
    let row = visible(&state.blobs, &caller.namespace, &d).await?;
    // Raw bytes are not for a redacted token (once it is known to see the blob: else 404).
    caller.require_raw()?;
    if if_none_match(&headers, &row) {
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, etag(&row))]).into_response());
    }
    let range = parse_range(&headers, row.size)?;
    let (status, span) = match &range {
        Some(r) => (StatusCode::PARTIAL_CONTENT, r.clone()),
        None => (StatusCode::OK, 0..row.size),
    };
    let len = span.end - span.start;
    metrics::counter!("spillway_bytes_out_total").increment(len);
    let body = match &row.inline_data {
        Some(data) => Body::from(data[span.start as usize..span.end as usize].to_vec()),
        None => {
            let stream = crate::blobs::source::blob_stream(&state.blobs, &row, span.clone()).await?;
            let stream = giving_way(state.heavy.clone(), len, stream);
            // The status went out already: a failure now cuts the connection short, and the
            // log says why.
            Body::from_stream(stream.map_err(|e| {
                tracing::error!(error = %e, "download failed after its first bytes; connection cut");
                std::io::Error::other(e.to_string())
            }))
        }
    };
    let mut resp = (status, base_headers(&row), body).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    if range.is_some() {
        let cr = format!("bytes {}-{}/{}", span.start, span.end - 1, row.size);
        h.insert(header::CONTENT_RANGE, HeaderValue::from_str(&cr).map_err(ApiError::internal)?);
    }
    Ok(resp)
}

/// `POST /v1/blobs/{digest}/pin`: a reference that never expires.
#[utoipa::path(post, path = "/v1/blobs/{digest}/pin", params(("digest" = String, Path)), request_body = Option<PinRequest>,
    responses((status = 200, body = BlobRecord), (status = 404, body = spillway_api::ErrorBody)))]
pub(super) async fn pin_blob(
    State(state): State<AppState>,
    caller: Caller,
    Path(raw): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Json<BlobRecord>> {
    caller.require(Scope::Admin)?;
    let d = parse_digest(&raw)?;
    let req: PinRequest = json_object_body(&body, "pin body must be a JSON object like {\"reason\": \"INC-42\"}")?;
    Ok(Json(refs::pin(&state.blobs, &caller.namespace, &d, &req).await?))
}

/// `DELETE /v1/blobs/{digest}/pin`: removes this namespace's pins.
#[utoipa::path(delete, path = "/v1/blobs/{digest}/pin", params(("digest" = String, Path)), responses((status = 204), (status = 404, body = spillway_api::ErrorBody)))]
pub(super) async fn unpin_blob(
    State(state): State<AppState>,
    caller: Caller,
    Path(raw): Path<String>,
) -> ApiResult<StatusCode> {
    caller.require(Scope::Admin)?;
    refs::unpin(&state.blobs, &caller.namespace, &parse_digest(&raw)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/blobs/{digest}`: removes all of this namespace's references.
#[utoipa::path(delete, path = "/v1/blobs/{digest}", params(("digest" = String, Path)), responses((status = 204), (status = 404, body = spillway_api::ErrorBody)))]
pub(super) async fn delete_blob(
    State(state): State<AppState>,
    caller: Caller,
    Path(raw): Path<String>,
) -> ApiResult<StatusCode> {
    caller.require(Scope::Admin)?;
    refs::delete(&state.blobs, &caller.namespace, &parse_digest(&raw)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What `giving_way` takes to send three chunks of 1 MiB of a download of `len` bytes,
    /// each made in 20 ms, a request beginning while each is made (or none, `requests: false`).
    async fn send_three(len: u64, requests: bool) -> (std::time::Duration, Vec<usize>) {
        let work = std::time::Duration::from_millis(20);
        let heavy = Arc::new(Heavy::new(1, 1).unwrap());
        let made = heavy.clone();
        let chunks = futures::stream::iter(0..3).then(move |_| {
            let made = made.clone();
            async move {
                std::thread::sleep(work);
                if requests {
                    made.request_began();
                }
                Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'x'; GIVE_WAY_EVERY]))
            }
        });
        let t = std::time::Instant::now();
        let sent: Vec<usize> = giving_way(heavy, len, chunks).map(|c| c.unwrap().len()).collect().await;
        (t.elapsed(), sent)
    }

    #[tokio::test]
    async fn a_large_download_gives_way_while_requests_come() {
        // Bounds far apart (as heavy.rs's give-way test): 60 ms of work; resting twice as long
        // after each chunk makes it at least 180 ms; not resting, well under 120 ms.
        let (slow, sent) = send_three(1 << 30, true).await;
        assert_eq!(sent, vec![GIVE_WAY_EVERY; 3], "every byte is sent");
        assert!(slow >= std::time::Duration::from_millis(180), "{slow:?}");
        let (alone, _) = send_three(1 << 30, false).await;
        assert!(alone < std::time::Duration::from_millis(120), "no request, no rest: {alone:?}");
        let (small, _) = send_three(GIVES_WAY_FROM, true).await;
        assert!(small < std::time::Duration::from_millis(120), "a small download never rests: {small:?}");
    }

    fn range(h: &str, size: u64) -> ApiResult<Option<std::ops::Range<u64>>> {
        let mut headers = HeaderMap::new();
        headers.insert(header::RANGE, HeaderValue::from_str(h).unwrap());
        parse_range(&headers, size)
    }

    proptest! {
        #[test]
        fn satisfiable_ranges_stay_inside(size in 1u64..10_000, a in 0u64..12_000, len in 0u64..12_000) {
            let b = a + len;
            match range(&format!("bytes={a}-{b}"), size) {
                Ok(Some(r)) => prop_assert!(r.start == a && r.end == (b + 1).min(size) && r.start < r.end),
                Ok(None) => prop_assert!(false, "a single range is honoured"),
                Err(ApiError::RangeNotSatisfiable { size: Some(s), .. }) => prop_assert!(a >= size && s == size),
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
            match range(&format!("bytes=-{}", len + 1), size) {
                Ok(Some(r)) => prop_assert!(r.end == size && r.end - r.start == (len + 1).min(size)),
                other => prop_assert!(false, "suffix range: {other:?}"),
            }
        }

        /// Any header value: ignored (the whole blob), one range inside the blob, or a 416 —
        /// never a panic or another error. Only the `bytes` unit is ever honoured.
        #[test]
        fn any_header_is_ignored_honoured_or_416(h in prop_oneof!["[ -~]{0,40}", "bytes=[0-9, -]{0,20}"]) {
            match range(&h, 1000) {
                Ok(None) => {}
                Ok(Some(r)) => {
                    prop_assert!(h.starts_with("bytes="), "{} honoured", h);
                    prop_assert!(r.start < r.end && r.end <= 1000, "{:?}", r);
                }
                Err(ApiError::RangeNotSatisfiable { size: Some(1000), .. }) => prop_assert!(h.starts_with("bytes=")),
                Err(e) => prop_assert!(false, "{} gave {}", h, e),
            }
        }
    }

    #[test]
    fn ranges_not_understood_and_several_ranges_mean_the_whole_blob() {
        for ignored in ["bytes=x-", "items=0-1", "bytes=abc", "bytes=5-2", "bytes=0-1,4-5"] {
            assert_eq!(range(ignored, 10).unwrap(), None, "{ignored}");
        }
        assert!(matches!(range("bytes=10-", 10), Err(ApiError::RangeNotSatisfiable { .. })));
        assert!(matches!(range("bytes=-0", 10), Err(ApiError::RangeNotSatisfiable { .. })));
    }
}
