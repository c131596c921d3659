//! Streams as the service keeps them: creation, offset-checked appends, the long-poll that
//! waits for data, what a stream holds (its chunks while open, its blob once sealed) as one
//! read source, and the seal that makes the blob. Handlers in `http/routes/streams.rs` only parse
//! and answer.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use spillway_api::paging::lines::Checkpoint;
use spillway_api::paging::Source;
use spillway_api::{AppendResponse, BlobRecord, Digest, Labels, Namespace, SealRequest, StreamId, StreamState};

use crate::blobs::source::BlobSource;
use crate::blobs::upload::{self, RefSpec};
use crate::blobs::Blobs;
use crate::config::Config;
use crate::db::{AppendOutcome, Backend, Db, StreamRow};
use crate::error::{ApiError, ApiResult};

mod waiters;

pub use waiters::{StreamWaiters, Waiter};

/// Chunk size when a seal reads the stream back.
const SEAL_READ: u64 = 4 << 20;

/// What the stream service works with; cheap to clone.
#[derive(Clone)]
pub struct Streams {
    /// Stream rows and their chunks.
    pub db: Db,
    /// Where a seal makes its blob, and where a sealed stream is read from.
    pub blobs: Blobs,
    /// Readers long-polling on this replica.
    pub waiters: std::sync::Arc<StreamWaiters>,
    /// Streams open at once per namespace.
    pub max_open_streams: u64,
    /// Bytes one namespace may hold (`None`: no quota).
    pub namespace_quota_bytes: Option<u64>,
    /// How often a long-poll on PostgreSQL asks whether another replica appended.
    pub poll_interval: Duration,
}

impl Streams {
    /// The handle, with no reader waiting.
    pub fn new(blobs: Blobs, config: &Config) -> Self {
        Self {
            db: blobs.db.clone(),
            blobs,
            waiters: Default::default(),
            max_open_streams: config.max_open_streams,
            namespace_quota_bytes: config.namespace_quota_bytes,
            poll_interval: config.stream_poll_interval,
        }
    }

    /// Now, in milliseconds.
    pub fn now(&self) -> i64 {
        self.blobs.now()
    }
}

/// Where a read starts, which a long-poll waits for data at.
#[derive(Debug, Clone, Copy)]
pub enum Position {
    /// A byte offset.
    Byte(u64),
    /// A 1-based line.
    Line(u64),
}

/// The stream if it lives in `ns`; `404` otherwise, whether it exists elsewhere or not.
pub async fn find(streams: &Streams, ns: &Namespace, id: &StreamId) -> ApiResult<StreamRow> {
    streams.db.get_stream(ns, id).await?.ok_or_else(|| ApiError::NotFound(format!("stream {id}")))
}

/// Creates an open, empty stream in `ns`.
pub async fn create(
    streams: &Streams,
    ns: &Namespace,
    labels: &Labels,
    ttl_ms: i64,
    max_bytes: u64,
) -> ApiResult<StreamId> {
    let id = StreamId::new(&uuid::Uuid::new_v4().simple().to_string()).map_err(ApiError::internal)?;
    let max = streams.max_open_streams;
    if !streams.db.create_stream(&id, ns, labels, ttl_ms, max_bytes, streams.now(), max).await? {
        return Err(ApiError::TooManyRequests {
            message: format!("this namespace has {max} streams open (--max-open-streams); seal or let some expire"),
            retry_after: 60,
        });
    }
    Ok(id)
}

/// Appends one piece at `offset` (the request asked for `asked`, where its first piece goes)
/// and wakes the stream's readers; the cap reached is `413 stream_limit_exceeded`.
pub async fn append(
    streams: &Streams,
    ns: &Namespace,
    id: &StreamId,
    offset: u64,
    asked: u64,
    data: &Bytes,
) -> ApiResult<AppendResponse> {
    if let Some(quota) = streams.namespace_quota_bytes {
        let used = streams.db.namespace_usage(ns, streams.now()).await?;
        if used.saturating_add(data.len() as u64) > quota {
            return Err(ApiError::QuotaExceeded { quota, used });
        }
    }
    match streams.db.append_stream(ns, id, offset, data).await? {
        AppendOutcome::Stored { size, state: st, dropped } => {
            streams.waiters.wake(id);
            metrics::counter!("spillway_bytes_in_total").increment(data.len() as u64 - dropped);
            if dropped > 0 {
                return Err(ApiError::StreamLimitExceeded(find(streams, ns, id).await?.max_bytes));
            }
            Ok(AppendResponse { size, state: st })
        }
        AppendOutcome::RetriedAtCap => Err(ApiError::StreamLimitExceeded(find(streams, ns, id).await?.max_bytes)),
        AppendOutcome::NotFound => Err(ApiError::NotFound(format!("stream {id}"))),
        AppendOutcome::OffsetMismatch(size) => Err(ApiError::OffsetMismatch { given: asked, size }),
        AppendOutcome::Closed(st) => Err(ApiError::StreamClosed(st.as_str())),
    }
}

/// Whether a reader at the end should wait: the stream is open, or being sealed (its blob is
/// about to be named, and the page that ends the wait should name it).
fn may_grow(row: &StreamRow) -> bool {
    row.state == StreamState::Open || (row.state == StreamState::Sealed && row.digest.is_none())
}

/// True when the stream holds something at or past `at`.
fn has_data_for(row: &StreamRow, at: Position) -> bool {
    match at {
        Position::Byte(offset) => offset < row.size,
        Position::Line(line) => line <= row.lines(),
    }
}

/// The stream once it holds data at `at`, or it can no longer grow, or `wait` has passed.
/// Appends and seals on this server wake the wait at once. On PostgreSQL, those of other
/// replicas are seen at the next database poll; on SQLite this process is the only writer (as
/// the visibility cache assumes too), so a waiting reader costs nothing until it is woken.
pub async fn wait_for(
    streams: &Streams,
    ns: &Namespace,
    id: &StreamId,
    at: Position,
    wait: Duration,
) -> ApiResult<StreamRow> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut row = find(streams, ns, id).await?;
    while may_grow(&row) && !has_data_for(&row, at) && tokio::time::Instant::now() < deadline {
        let notify = streams.waiters.get(id);
        let woken = notify.notified();
        row = find(streams, ns, id).await?;
        if !may_grow(&row) || has_data_for(&row, at) {
            break;
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let nap = match streams.db.backend() {
            Backend::Postgres => streams.poll_interval.min(left),
            Backend::Sqlite => left,
        };
        let _ = tokio::time::timeout(nap, woken).await;
        row = find(streams, ns, id).await?;
    }
    Ok(row)
}

/// What a stream holds so far, as one read source: its chunks while open, its blob once
/// sealed.
pub enum Content {
    /// Chunks in the database.
    Open {
        /// Where the chunks are.
        db: Db,
        /// The stream as it was when the read began.
        row: StreamRow,
    },
    /// The blob its seal made.
    Sealed(BlobSource),
}

/// A read over [`Content`], as a boxed future borrowing it.
pub type ContentOp<'a, T> = Pin<Box<dyn Future<Output = ApiResult<T>> + Send + 'a>>;

/// Runs `op` over what `row` holds. A stream sealed meanwhile lost its chunks to its blob, which
/// has the same bytes: `op` runs again over the blob. Returns the blob's digest when it read it.
pub async fn read_content<T>(
    streams: &Streams,
    ns: &Namespace,
    row: StreamRow,
    op: impl for<'a> Fn(&'a Content) -> ContentOp<'a, T>,
) -> ApiResult<(T, Option<Digest>)> {
    let id = row.id.clone();
    if let Some(digest) = row.digest {
        return Ok((op(&sealed(streams, ns, &id, &digest).await?).await?, Some(digest)));
    }
    match op(&Content::Open { db: streams.db.clone(), row }).await {
        Err(ApiError::Unavailable(_)) => match find(streams, ns, &id).await?.digest {
            Some(digest) => Ok((op(&sealed(streams, ns, &id, &digest).await?).await?, Some(digest))),
            None => Err(ApiError::Unavailable("the stream changed while it was read; retry".into())),
        },
        done => Ok((done?, None)),
    }
}

/// The blob a sealed stream became.
async fn sealed(streams: &Streams, ns: &Namespace, id: &StreamId, digest: &Digest) -> ApiResult<Content> {
    let blob = streams
        .db
        .visible_blob(ns, digest, streams.now())
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("stream {id}")))?;
    Ok(Content::Sealed(BlobSource::new(&streams.blobs, &std::sync::Arc::new(blob))?))
}

#[async_trait]
impl Source for Content {
    type Error = ApiError;
    fn size(&self) -> u64 {
        match self {
            Self::Open { row, .. } => row.size,
            Self::Sealed(b) => b.size(),
        }
    }
    fn total_lines(&self) -> u64 {
        match self {
            Self::Open { row, .. } => row.lines(),
            Self::Sealed(b) => b.total_lines(),
        }
    }
    fn digest(&self) -> Option<String> {
        match self {
            Self::Open { .. } => None,
            Self::Sealed(b) => b.digest(),
        }
    }
    async fn checkpoint_for_offset(&self, offset: u64) -> ApiResult<Checkpoint> {
        match self {
            Self::Open { db, row } => Ok(db.stream_checkpoint_for_offset(&row.id, offset).await?),
            Self::Sealed(b) => Ok(b.checkpoint_for_offset(offset).await?),
        }
    }
    async fn checkpoint_for_line(&self, line: u64) -> ApiResult<Checkpoint> {
        match self {
            Self::Open { db, row } => Ok(db.stream_checkpoint_for_line(&row.id, line).await?),
            Self::Sealed(b) => Ok(b.checkpoint_for_line(line).await?),
        }
    }
    async fn read(&self, start: u64, end: u64) -> ApiResult<Bytes> {
        match self {
            Self::Open { db, row } => Ok(db.read_stream(&row.id, start, end).await?),
            Self::Sealed(b) => Ok(b.read(start, end).await?),
        }
    }
}

/// Seals the stream with how its task ended, and makes its content a blob referenced in `ns`
/// with the stream's labels and TTL. Returns the record and whether the blob is new. A second
/// seal answers the first one's blob.
pub async fn seal(streams: &Streams, ns: &Namespace, id: &StreamId, how: SealRequest) -> ApiResult<(BlobRecord, bool)> {
    find(streams, ns, id).await?;
    let row = streams
        .db
        .close_stream(ns, id, how.exit_code.map(i64::from), how.signal)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("stream {id}")))?;
    streams.waiters.wake(id);
    if let Some(digest) = &row.digest {
        let blob = streams
            .db
            .visible_blob(ns, digest, streams.now())
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("sealed blob of stream {id}")))?;
        // The reference keeps its expiry: say it (absent only when pinned).
        let until = streams.db.visible_until(ns, digest, streams.now()).await?.filter(|&t| t != i64::MAX);
        return Ok((blob.record(true, until.map(crate::clock::rfc3339)), false));
    }
    let spec = RefSpec { namespace: ns.clone(), labels: row.labels.clone(), ttl_ms: Some(row.ttl_ms) };
    let stored = upload::store(&streams.blobs, None, &spec, chunks(&streams.db, &row), Some(row.size)).await?;
    if stored.record.size != row.size {
        return Err(ApiError::Unavailable("the stream changed while it was sealed; retry".into()));
    }
    streams.db.finish_seal(id, &stored.record.digest).await?;
    streams.waiters.wake(id);
    let fresh = !stored.record.deduplicated;
    Ok((stored.record, fresh))
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
