//! `/v1/streams`: background task output. Appends are offset-checked in the database, reads
//! page through what is there so far (long-polling with `wait_ms`), and seal makes a blob.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use serde::Deserialize;
use spillway_api::{
    AppendResponse, BlobRecord, Digest, GrepResponse, ReadPage, SealRequest, StreamCreated, StreamId, StreamInfo,
    MAX_WAIT_MS,
};

use super::extract::{json_object_body, RefOptions, Q};
use super::query::{page_of, GrepQuery, ReadQuery};
use crate::auth::{Caller, Scope};
use crate::db::StreamRow;
use crate::error::{ApiError, ApiResult};
use crate::http::json::PageJson;
use crate::state::AppState;
use crate::streams;
use spillway_api::paging::{self, Source};

/// An append's body is stored in pieces of this size (an append of any size is taken).
const APPEND_PIECE: usize = 4 << 20;

fn stream_id(raw: &str) -> ApiResult<StreamId> {
    StreamId::new(raw).map_err(|e| ApiError::InvalidArgument(e.to_string()))
}

fn info(row: &StreamRow) -> StreamInfo {
    StreamInfo {
        id: row.id.to_string(),
        size: row.size,
        state: row.state,
        digest: row.digest.as_ref().map(Digest::to_string),
        max_bytes: row.max_bytes,
        exit_code: row.exit_code.and_then(|c| i32::try_from(c).ok()),
        signal: row.signal.clone(),
        capped: row.hit_cap,
    }
}

/// The seal's optional body: empty, or `{"exit_code": N|null, "signal": "TERM"|null}`.
fn parse_seal(body: &[u8]) -> ApiResult<SealRequest> {
    let req: SealRequest =
        json_object_body(body, "seal body must be a JSON object like {\"exit_code\": 0, \"signal\": null}")?;
    if let Some(sig) = &req.signal {
        if sig.is_empty() || sig.len() > 16 || !sig.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit()) {
            return Err(ApiError::InvalidArgument(format!("signal must be a name like TERM or KILL, got {sig:?}")));
        }
    }
    Ok(req)
}

/// `POST /v1/streams`.
#[utoipa::path(post, path = "/v1/streams", responses((status = 201, body = StreamCreated)))]
pub(super) async fn create_stream(
    State(state): State<AppState>,
    caller: Caller,
    Q(pairs): Q<Vec<(String, String)>>,
) -> ApiResult<Response> {
    caller.require(Scope::Write)?;
    let opts = RefOptions::parse(pairs, true)?;
    let ttl_ms = opts.ttl_ms(&state.config)?;
    let cap = state.config.max_stream_bytes;
    let max_bytes = opts.max_bytes.unwrap_or(cap);
    if max_bytes == 0 || max_bytes > cap {
        return Err(ApiError::InvalidArgument(format!("max_bytes must be 1 to {cap}")));
    }
    let id = streams::create(&state.streams, &caller.namespace, &opts.labels, ttl_ms, max_bytes).await?;
    Ok((StatusCode::CREATED, Json(StreamCreated { id: id.to_string(), max_bytes })).into_response())
}

/// `GET /v1/streams/{id}`.
#[utoipa::path(get, path = "/v1/streams/{id}", params(("id" = String, Path)), responses((status = 200, body = StreamInfo)))]
pub(super) async fn get_stream(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<StreamInfo>> {
    caller.require(Scope::Read)?;
    let id = stream_id(&id)?;
    Ok(Json(info(&streams::find(&state.streams, &caller.namespace, &id).await?)))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct AppendQuery {
    /// Must equal the stream's current size.
    offset: u64,
}

/// `POST /v1/streams/{id}/append?offset=N`.
#[utoipa::path(post, path = "/v1/streams/{id}/append", params(("id" = String, Path), AppendQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, body = AppendResponse), (status = 409, body = spillway_api::ErrorBody), (status = 413, body = spillway_api::ErrorBody)))]
pub(super) async fn append_stream(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Q(q): Q<AppendQuery>,
    body: axum::body::Body,
) -> ApiResult<Json<AppendResponse>> {
    caller.require(Scope::Write)?;
    let id = stream_id(&id)?;
    // The body is taken in pieces, each an offset-checked append of its own, so an append of
    // any size stores up to the stream's cap and a retried one is a no-op piece by piece.
    let mut frames = body.into_data_stream();
    let (mut offset, mut piece) = (q.offset, BytesMut::new());
    let mut last = None;
    loop {
        let frame = frames
            .next()
            .await
            .transpose()
            .map_err(|e| ApiError::InvalidArgument(format!("reading the request body failed: {e}")))?;
        let done = frame.is_none();
        match frame {
            Some(f) => {
                piece.extend_from_slice(&f);
                if piece.len() < APPEND_PIECE {
                    continue;
                }
            }
            None if piece.is_empty() && last.is_some() => break,
            None => {}
        }
        let data = piece.split().freeze();
        let answer = streams::append(&state.streams, &caller.namespace, &id, offset, q.offset, &data).await?;
        offset += data.len() as u64;
        last = Some(answer);
        if done {
            break;
        }
    }
    Ok(Json(last.expect("at least one piece is appended")))
}

/// `GET /v1/streams/{id}/read`: the capped read API over what is written so far.
#[utoipa::path(get, path = "/v1/streams/{id}/read", params(("id" = String, Path), ReadQuery),
    responses((status = 200, body = ReadPage)))]
pub(super) async fn read_stream(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Q(q): Q<ReadQuery>,
) -> ApiResult<PageJson> {
    caller.require(Scope::Read)?;
    let id = stream_id(&id)?;
    q.check()?;
    let wait = q.wait_ms().unwrap_or(0);
    if wait > MAX_WAIT_MS {
        return Err(ApiError::InvalidArgument(format!("wait_ms must be at most {MAX_WAIT_MS}")));
    }
    let row =
        streams::wait_for(&state.streams, &caller.namespace, &id, q.wants_after(), Duration::from_millis(wait)).await?;
    let redact = caller.redacts(q.redact()).then(|| state.blobs.redactor.clone());
    let (mut page, sealed) = streams::read_content(&state.streams, &caller.namespace, row, |src| {
        let (q, redact) = (q.clone(), redact.clone());
        Box::pin(async move { page_of(src, &q, redact.as_deref()).await })
    })
    .await?;
    if let Some(digest) = sealed {
        page.digest = Some(digest.to_string());
    }
    Ok(PageJson(page))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct BytesQuery {
    /// First byte (default 0).
    offset: Option<u64>,
    /// Most bytes (default and maximum 4 MiB).
    #[param(minimum = 1, maximum = 4_194_304)]
    limit: Option<u64>,
}

/// `GET /v1/streams/{id}/bytes`: the raw bytes written so far from `offset` (at most `limit`),
/// for a reader that processes them (`spillway exec --stdin <stream>`) rather than shows them.
/// `x-spillway-stream-size` says how much was written when they were read; bytes once written
/// never change, so a reader walks to that size in as many calls as it takes.
#[utoipa::path(get, path = "/v1/streams/{id}/bytes", params(("id" = String, Path), BytesQuery),
    responses((status = 200, description = "The bytes (`application/octet-stream`); `x-spillway-stream-size`: \
        the stream's size when they were read."), (status = 416, body = spillway_api::ErrorBody)))]
pub(super) async fn stream_bytes(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Q(q): Q<BytesQuery>,
) -> ApiResult<Response> {
    caller.require(Scope::Read)?;
    let id = stream_id(&id)?;
    let limit = match q.limit {
        None => APPEND_PIECE as u64,
        Some(l) if (1..=APPEND_PIECE as u64).contains(&l) => l,
        Some(_) => return Err(ApiError::InvalidArgument(format!("limit must be 1 to {APPEND_PIECE}"))),
    };
    let offset = q.offset.unwrap_or(0);
    let row = streams::find(&state.streams, &caller.namespace, &id).await?;
    let state_name = row.state;
    let ((size, data), _) = streams::read_content(&state.streams, &caller.namespace, row, |src| {
        Box::pin(async move {
            let size = src.size();
            if offset > size {
                let message = format!("offset {offset} is past the end ({size} bytes)");
                return Err(ApiError::RangeNotSatisfiable { message, size: Some(size) });
            }
            Ok((size, src.read(offset, size.min(offset.saturating_add(limit))).await?))
        })
    })
    .await?;
    let headers = [
        (axum::http::header::CONTENT_TYPE, "application/octet-stream".to_owned()),
        (axum::http::HeaderName::from_static("x-spillway-stream-size"), size.to_string()),
        (axum::http::HeaderName::from_static("x-spillway-stream-state"), state_name.as_str().to_owned()),
    ];
    Ok((headers, data).into_response())
}

/// `GET /v1/streams/{id}/grep`: grep over what is written so far (the blob, once sealed),
/// with the parameters and answer of blob grep.
#[utoipa::path(get, path = "/v1/streams/{id}/grep", params(("id" = String, Path), GrepQuery),
    responses((status = 200, body = GrepResponse), (status = 400, body = spillway_api::ErrorBody)))]
pub(super) async fn grep_stream(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Q(q): Q<GrepQuery>,
) -> ApiResult<Response> {
    caller.require(Scope::Read)?;
    let id = stream_id(&id)?;
    let regex = q.compile()?;
    let row = streams::find(&state.streams, &caller.namespace, &id).await?;
    let (st, ns, budget) = (state.streams.clone(), caller.namespace.clone(), state.config.search_budget);
    let redact = caller.redacts(q.redact()).then(|| state.blobs.redactor.clone());
    let body = state
        .heavy
        .run(async move {
            let deadline = std::time::Instant::now() + budget;
            let (found, _) = streams::read_content(&st, &ns, row, |src| {
                let (q, regex, redact) = (q.clone(), regex.clone(), redact.clone());
                Box::pin(
                    async move { Ok(paging::grep(src, q.request(&regex, Some(deadline), redact.as_deref())).await?) },
                )
            })
            .await?;
            serde_json::to_vec(&found).map_err(ApiError::internal)
        })
        .await?;
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// `POST /v1/streams/{id}/seal`: the stream's content becomes a blob in the namespace.
#[utoipa::path(post, path = "/v1/streams/{id}/seal", params(("id" = String, Path)),
    request_body(content = Option<SealRequest>, content_type = "application/json"),
    responses((status = 201, body = BlobRecord), (status = 200, body = BlobRecord)))]
pub(super) async fn seal_stream(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    caller.require(Scope::Write)?;
    let how = parse_seal(&body)?;
    let id = stream_id(&id)?;
    let (record, fresh) = streams::seal(&state.streams, &caller.namespace, &id, how).await?;
    let status = if fresh { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(record)).into_response())
}
