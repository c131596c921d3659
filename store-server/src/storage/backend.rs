//! Where blob and pack bytes live. Each kind of storage is a type of its own behind
//! [`Backend`] — local disk ([`local::LocalDisk`]: plain files, fsynced, read by `pread`) and
//! object storage ([`object::ObjectBackend`]: S3 through `object_store`, multipart uploads
//! straight to the content key, a block cache for ranged reads) — as attic's `StorageBackend`
//! and sccache's `Storage` are. `storage/mod.rs` (receiving, hashing, publishing) and `chunks/`
//! (packs of compressed chunks) sit above and never ask which one they have.
//!
//! A body too large for its row is received by the backend's [`Sink`] into a temporary copy,
//! a [`Spilled`] value that knows how to publish itself under its content key and how to go
//! away: every kind of copy comes with its own publication, so none can meet the wrong one.

use std::ops::Range;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::ObjectStore;
use spillway_api::Digest;

/// A failure's cause, kept for the log.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// What can go wrong with blob bytes. Storage failures keep their cause.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// The body passed the size limit.
    #[error("body is over {0} bytes")]
    TooLarge(u64),
    /// The client's body failed (disconnect, bad chunking).
    #[error("reading the request body failed: {0}")]
    Body(String),
    /// The disk or quota is full.
    #[error("storage is full")]
    Full(#[source] Cause),
    /// The object is not there.
    #[error("object not found")]
    NotFound,
    /// Any other storage failure.
    #[error("blob storage failed")]
    Storage(#[source] Cause),
    /// Stored bytes that fail their hash, or that are gone while their row says they are
    /// there: of the blob named (or, inside the chunk layer, of the chunk named).
    #[error("the stored bytes of {0} fail their hash or are gone")]
    Corrupt(Digest),
}

impl BlobError {
    /// A storage failure of our own making, described in words.
    pub fn storage(what: impl Into<String>) -> Self {
        Self::Storage(what.into().into())
    }
}

/// The kind of the first I/O error in a chain of causes: how a full disk is recognised through
/// the layers of object_store, without reading messages.
fn io_kind(err: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        cur = e.source();
    }
    None
}

fn is_full(kind: Option<std::io::ErrorKind>) -> bool {
    matches!(kind, Some(std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded))
}

impl From<std::io::Error> for BlobError {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            std::io::ErrorKind::NotFound => Self::NotFound,
            kind if is_full(Some(kind)) => Self::Full(e.into()),
            _ => Self::Storage(e.into()),
        }
    }
}

impl From<tokio::task::JoinError> for BlobError {
    fn from(e: tokio::task::JoinError) -> Self {
        Self::Storage(e.into())
    }
}

impl From<object_store::Error> for BlobError {
    fn from(e: object_store::Error) -> Self {
        match e {
            object_store::Error::NotFound { .. } => Self::NotFound,
            other if is_full(io_kind(&other)) => Self::Full(other.into()),
            other => Self::Storage(other.into()),
        }
    }
}

/// Completes bytes written under a temporary name (or straight to their content key): run
/// later, inside the transaction that references them (`Db::add_ref`).
pub type Completion = Box<dyn FnOnce() -> futures::future::BoxFuture<'static, Result<(), BlobError>> + Send>;

/// A chunk of bytes as a download streams it.
pub type ByteStream = BoxStream<'static, Result<Bytes, BlobError>>;

/// Where a blob is stored, by its BLAKE3 digest.
pub(crate) fn blob_key(d: &Digest) -> Path {
    let hex = d.hex();
    Path::from(format!("blobs/{}/{hex}", &hex[..2]))
}

/// Where a pack of chunks is stored (`id`: 32 hex).
pub(crate) fn pack_key(id: &str) -> Path {
    Path::from(format!("packs/{}/{id}", &id[..2]))
}

/// A body being received into a backend's temporary copy.
#[async_trait]
pub(crate) trait Sink: Send {
    /// Appends bytes.
    async fn write(&mut self, data: Bytes) -> Result<(), BlobError>;
    /// Makes the bytes durable (a file: fdatasync) or complete (an object, or every part of a
    /// multipart upload, which its publication completes).
    async fn finish(self: Box<Self>) -> Result<(), BlobError>;
    /// Stops writing; what was written is left to the copy's removal.
    async fn abort(self: Box<Self>);
}

/// A temporary copy of a body, verified or not yet: published under its content key by
/// [`Spilled::publisher`], removed when dropped — on every path: a failed upload, a dropped
/// request, a published one (its final name is a link or a copy). A direct upload not completed
/// by then is aborted; a completed one is the blob and stays.
#[async_trait]
pub(crate) trait Spilled: Send + Sync + std::fmt::Debug {
    /// What makes the copy readable as blob `digest`, owning what it needs. Idempotent:
    /// publishing content that is there already (a concurrent identical upload) succeeds.
    fn publisher(&self, digest: &Digest) -> Completion;
    /// True when the bytes were written straight to their content key.
    fn is_direct(&self) -> bool {
        false
    }
    /// True when the copy is better removed a while after the answer (`BlobStore::discard`).
    fn removed_late(&self) -> bool {
        false
    }
    /// Removes the copy now and waits for it (dropping it only starts the removal).
    async fn remove(self: Box<Self>);
}

/// One kind of storage for blob and pack bytes.
#[async_trait]
pub(crate) trait Backend: Send + Sync + std::fmt::Debug {
    /// The keys as objects: listing, deletion, existence.
    fn objects(&self) -> &Arc<dyn ObjectStore>;
    /// Files and directories made durable so far (what tests compare across paths).
    fn syncs(&self) -> &AtomicU64;
    /// Opens the temporary copy of a body that outgrew its row; with `announced`, the digest
    /// the caller promised, a backend may write straight to that content key.
    async fn open_sink(&self, announced: Option<Digest>) -> Result<(Box<dyn Sink>, Box<dyn Spilled>), BlobError>;
    /// Whether an announced upload is written straight to its content key.
    fn writes_direct(&self) -> bool;
    /// Bytes `range` of blob `d` of `size` bytes; past its end is an error, never a short answer.
    async fn read_blob(&self, d: &Digest, size: u64, range: Range<u64>) -> Result<Bytes, BlobError>;
    /// Blob `d`'s bytes `range` as a stream, for full downloads.
    async fn stream_blob(&self, d: &Digest, range: Range<u64>) -> Result<ByteStream, BlobError>;
    /// Bytes `range` of a pack.
    async fn read_pack(&self, id: &str, range: Range<u64>) -> Result<Bytes, BlobError>;
    /// Writes a pack durably: it is stored once this returns.
    async fn put_pack(&self, id: &str, data: Bytes) -> Result<(), BlobError>;
    /// Tells the backend that bytes `range` of blob `d` (of `size` bytes) will be read soon,
    /// so that it starts fetching them now: a scan reading ahead of itself. Nothing waits for
    /// it, and a read that comes before it ends joins it or reads as usual.
    fn will_read(self: Arc<Self>, _d: &Digest, _size: u64, _range: Range<u64>) {}
    /// Lets go of what a deleted blob held open, so that its space is freed.
    fn forget_blob(&self, _d: &Digest) {}
    /// Lets go of what a deleted pack held open.
    fn forget_pack(&self, _id: &str) {}
}
