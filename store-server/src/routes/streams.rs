//! `/v1/streams`: background task output. Appends are offset-checked in the database, reads
//! page through what is there so far (long-polling with `wait_ms`), and seal makes a blob.

use std::time::Duration;

use async_trait::async_trait;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use serde::Deserialize;
use spillway_api::{
    AppendResponse, BlobRecord, Digest, GrepResponse, ReadPage, SealRequest, StreamCreated, StreamId, StreamInfo,
    StreamState, MAX_WAIT_MS,
};

use super::extract::{json_object_body, RefOptions, Q};
use super::query::{page_of, GrepQuery, Position, ReadQuery};
use crate::auth::{Caller, Scope};
use crate::db::{AppendOutcome, Db, DbError, StreamRow};
use crate::error::{ApiError, ApiResult};
use crate::json::PageJson;
use crate::state::AppState;
use crate::store::BlobSource;
use crate::upload::{self, RefSpec};
use spillway_api::paging::lines::Checkpoint;
use spillway_api::paging::{self, Source};

/// An append's body is stored in pieces of this size (an append of any size is taken).
const APPEND_PIECE: usize = 4 << 20;
/// Chunk size when a seal reads the stream back.
const SEAL_READ: u64 = 4 << 20;

fn stream_id(raw: &str) -> ApiResult<StreamId> {
    StreamId::new(raw).map_err(|e| ApiError::InvalidArgument(e.to_string()))
}

async fn find(state: &AppState, caller: &Caller, id: &StreamId) -> ApiResult<StreamRow> {
    state.db.get_stream(&caller.namespace, id).await?.ok_or_else(|| ApiError::NotFound(format!("stream {id}")))
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
    let id = StreamId::new(&uuid::Uuid::new_v4().simple().to_string()).map_err(ApiError::internal)?;
    state.db.create_stream(&id, &caller.namespace, &opts.labels, ttl_ms, max_bytes, state.now()).await?;
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
    Ok(Json(info(&find(&state, &caller, &id).await?)))
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
        let answer = append_piece(&state, &caller, &id, offset, q.offset, &data).await?;
        offset += data.len() as u64;
        last = Some(answer);
        if done {
            break;
        }
    }
    Ok(Json(last.expect("at least one piece is appended")))
}

/// One piece of an append; the stream's cap reached is `413 stream_limit_exceeded`.
async fn append_piece(
    state: &AppState,
    caller: &Caller,
    id: &StreamId,
    offset: u64,
    asked: u64,
    data: &Bytes,
) -> ApiResult<AppendResponse> {
    match state.db.append_stream(&caller.namespace, id, offset, data).await? {
        AppendOutcome::Stored { size, state: st, dropped } => {
            state.stream_waiters.wake(id);
            metrics::counter!("spillway_bytes_in_total").increment(data.len() as u64 - dropped);
            if dropped > 0 {
                let row = find(state, caller, id).await?;
                return Err(ApiError::StreamLimitExceeded(row.max_bytes));
            }
            Ok(AppendResponse { size, state: st })
        }
        AppendOutcome::RetriedAtCap => Err(ApiError::StreamLimitExceeded(find(state, caller, id).await?.max_bytes)),
        AppendOutcome::NotFound => Err(ApiError::NotFound(format!("stream {id}"))),
        AppendOutcome::OffsetMismatch(size) => Err(ApiError::OffsetMismatch { given: asked, size }),
        AppendOutcome::Closed(st) => Err(ApiError::StreamClosed(st.as_str())),
    }
}

/// What a stream holds so far, as a read source.
struct StreamSource {
    db: Db,
    row: StreamRow,
}

#[async_trait]
impl Source for StreamSource {
    type Error = DbError;
    fn size(&self) -> u64 {
        self.row.size
    }
    fn total_lines(&self) -> u64 {
        self.row.lines()
    }
    fn digest(&self) -> Option<String> {
        None
    }
    async fn checkpoint_for_offset(&self, offset: u64) -> Result<Checkpoint, DbError> {
        self.db.stream_checkpoint_for_offset(&self.row.id, offset).await
    }
    async fn checkpoint_for_line(&self, line: u64) -> Result<Checkpoint, DbError> {
        self.db.stream_checkpoint_for_line(&self.row.id, line).await
    }
    async fn read(&self, start: u64, end: u64) -> Result<Bytes, DbError> {
        self.db.read_stream(&self.row.id, start, end).await
    }
}

/// True when the stream holds something at or past where the read starts.
fn has_data_for(row: &StreamRow, q: &ReadQuery) -> bool {
    match q.wants_after() {
        Position::Byte(offset) => offset < row.size,
        Position::Line(line) => line <= row.lines(),
    }
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
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait);
    let mut row = find(&state, &caller, &id).await?;
    while may_grow(&row) && !has_data_for(&row, &q) && tokio::time::Instant::now() < deadline {
        let notify = state.stream_waiters.get(&id);
        let woken = notify.notified();
        row = find(&state, &caller, &id).await?;
        if !may_grow(&row) || has_data_for(&row, &q) {
            break;
        }
        let nap =
            state.config.stream_poll_interval.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        let _ = tokio::time::timeout(nap, woken).await;
        row = find(&state, &caller, &id).await?;
    }
    if let Some(digest) = &row.digest {
        return sealed_page(&state, &caller, &id, digest, &q).await;
    }
    let src = StreamSource { db: state.db.clone(), row };
    match page_of(&src, &q).await {
        // Sealed while we read (its chunks went): the blob has the same bytes.
        Err(ApiError::Unavailable(_)) => match find(&state, &caller, &id).await?.digest {
            Some(digest) => sealed_page(&state, &caller, &id, &digest, &q).await,
            None => Err(ApiError::Unavailable("the stream changed while it was read; retry".into())),
        },
        page => Ok(PageJson(page?)),
    }
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
) -> ApiResult<Json<GrepResponse>> {
    caller.require(Scope::Read)?;
    let id = stream_id(&id)?;
    let regex = q.compile()?;
    let row = find(&state, &caller, &id).await?;
    let digest = match row.digest {
        Some(digest) => digest,
        None => match paging::grep(&StreamSource { db: state.db.clone(), row }, q.request(&regex))
            .await
            .map_err(ApiError::from)
        {
            // Sealed while we searched (its chunks went): the blob has the same bytes.
            Err(ApiError::Unavailable(_)) => find(&state, &caller, &id)
                .await?
                .digest
                .ok_or_else(|| ApiError::Unavailable("the stream changed while it was searched; retry".into()))?,
            found => return Ok(Json(found?)),
        },
    };
    let src = sealed_source(&state, &caller, &id, &digest).await?;
    Ok(Json(paging::grep(&src, q.request(&regex)).await?))
}

/// The blob a sealed stream became, as a read source.
async fn sealed_source(state: &AppState, caller: &Caller, id: &str, digest: &Digest) -> ApiResult<BlobSource> {
    let blob = state
        .db
        .visible_blob(&caller.namespace, digest, state.now())
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("stream {id}")))?;
    BlobSource::new(state, &blob)
}

/// Whether a reader at the end should wait: the stream is open, or being sealed (its blob is
/// about to be named, and the page that ends the wait should name it).
fn may_grow(row: &StreamRow) -> bool {
    row.state == StreamState::Open || (row.state == StreamState::Sealed && row.digest.is_none())
}

/// A read of a sealed stream: its chunks became a blob.
async fn sealed_page(
    state: &AppState,
    caller: &Caller,
    id: &str,
    digest: &Digest,
    q: &ReadQuery,
) -> ApiResult<PageJson> {
    let src = sealed_source(state, caller, id, digest).await?;
    let mut page = page_of(&src, q).await?;
    page.digest = Some(digest.to_string());
    Ok(PageJson(page))
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
    find(&state, &caller, &id).await?;
    let row = state
        .db
        .close_stream(&caller.namespace, &id, how.exit_code.map(i64::from), how.signal)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("stream {id}")))?;
    state.stream_waiters.wake(&id);
    if let Some(digest) = &row.digest {
        let blob = state
            .db
            .visible_blob(&caller.namespace, digest, state.now())
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("sealed blob of stream {id}")))?;
        return Ok((StatusCode::OK, Json(blob.record(true, None))).into_response());
    }
    let spec = RefSpec { namespace: caller.namespace.clone(), labels: row.labels.clone(), ttl_ms: Some(row.ttl_ms) };
    let stored = upload::store(&state, None, &spec, chunks(&state.db, &row), Some(row.size)).await?;
    if stored.record.size != row.size {
        return Err(ApiError::Unavailable("the stream changed while it was sealed; retry".into()));
    }
    state.db.finish_seal(&id, &stored.record.digest).await?;
    state.stream_waiters.wake(&id);
    let status = if stored.record.deduplicated { StatusCode::OK } else { StatusCode::CREATED };
    Ok((status, Json(stored.record)).into_response())
}

/// A stream's stored bytes in order, [`SEAL_READ`] at a time, for its seal.
fn chunks(db: &Db, row: &StreamRow) -> impl futures::Stream<Item = ApiResult<Bytes>> + Send + 'static {
    let db = db.clone();
    let (sid, size) = (row.id.clone(), row.size);
    futures::stream::try_unfold(0u64, move |pos| {
        let (db, sid) = (db.clone(), sid.clone());
        async move {
            if pos >= size {
                return Ok(None);
            }
            let end = size.min(pos + SEAL_READ);
            let data = db.read_stream(&sid, pos, end).await?;
            if data.is_empty() {
                return Err(ApiError::Unavailable("the stream's chunks ended before its size".into()));
            }
            Ok(Some((data.clone(), pos + data.len() as u64)))
        }
    })
}
