//! `BlobStore`: blob bytes keyed by digest, over a [`Backend`] (local disk or object
//! storage, `local/` and `object/`, behind `backend.rs`). Uploads are hashed (BLAKE3 on the receiving task, SHA-256 on a
//! blocking thread once the body is large) while they are written to a unique temporary copy
//! (on local disk by a [`Spool`](crate::storage::local::spool::Spool) thread, which starts the writeback while
//! the body arrives); they are published under the content key only after the digest
//! matches, and on local disk only after file and directory are fsynced.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreScheme};
use sha2::{Digest as _, Sha256};
use spillway_api::Digest;
use url::Url;

use spillway_api::paging::lines::{LineIndex, LineIndexBuilder};

pub(crate) mod backend;
pub(crate) mod local;
pub(crate) mod object;

use crate::storage::backend::{blob_key, Backend, Sink, Spilled};
pub use crate::storage::backend::{BlobError, ByteStream, Cause, Completion};
pub(crate) use crate::storage::local::make_private;
use crate::storage::local::LocalDisk;
use crate::storage::object::ObjectBackend;

/// Blobs up to this size are stored inline in their metadata row: one group commit makes
/// them durable, with no file and no fsync of their own.
pub const INLINE_MAX: usize = 16 << 10;
/// Above this many bytes SHA-256 moves to its own thread, off the receiving task.
const SHA_INLINE_LIMIT: u64 = 256 << 10;

/// Bytes received, verified by hash, not yet published.
#[derive(Debug)]
pub struct Staged {
    /// BLAKE3 of the bytes.
    pub digest: Digest,
    /// SHA-256 of the bytes.
    pub sha256: [u8; 32],
    /// Size in bytes.
    pub size: u64,
    /// Lines, counted as `wc -l` does plus a last line without a newline.
    pub lines: u64,
    /// Checkpoints for line pages.
    pub index: LineIndex,
    copy: Copy,
}

/// Where staged bytes are: in memory (small enough for their row), or in a backend's
/// temporary copy, removed when it is dropped.
#[derive(Debug)]
enum Copy {
    Inline(Bytes),
    Spilled(Box<dyn Spilled>),
}

impl Copy {
    async fn remove(self) {
        if let Self::Spilled(copy) = self {
            copy.remove().await;
        }
    }
}

/// Where the bytes of a body being received are: in memory, or written to a temporary copy.
enum Held {
    Memory(BytesMut),
    Spilled(Box<dyn Sink>, Box<dyn Spilled>),
}

impl Staged {
    /// True when the bytes were written straight to their content key (completed by their
    /// publisher, once).
    pub fn is_direct(&self) -> bool {
        matches!(&self.copy, Copy::Spilled(c) if c.is_direct())
    }

    /// The bytes, when the blob is small enough to be stored inline with its metadata.
    pub fn inline(&self) -> Option<&Bytes> {
        match &self.copy {
            Copy::Inline(b) => Some(b),
            Copy::Spilled(_) => None,
        }
    }
}

/// SHA-256 that starts inline and moves to a blocking thread when the body grows.
enum ShaHasher {
    Inline(Sha256),
    Thread(tokio::sync::mpsc::Sender<Bytes>, tokio::task::JoinHandle<[u8; 32]>),
}

impl ShaHasher {
    async fn update(&mut self, data: Bytes, seen: u64) {
        match self {
            Self::Inline(h) if seen <= SHA_INLINE_LIMIT => h.update(&data),
            Self::Inline(h) => {
                let mut h = std::mem::take(h);
                let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(64);
                let task = tokio::task::spawn_blocking(move || {
                    while let Some(b) = rx.blocking_recv() {
                        h.update(&b);
                    }
                    h.finalize().into()
                });
                let _ = tx.send(data).await;
                *self = Self::Thread(tx, task);
            }
            Self::Thread(tx, _) => {
                let _ = tx.send(data).await;
            }
        }
    }

    async fn finish(self) -> Result<[u8; 32], BlobError> {
        match self {
            Self::Inline(h) => Ok(h.finalize().into()),
            Self::Thread(tx, task) => {
                drop(tx);
                task.await.map_err(|e| BlobError::Storage(e.into()))
            }
        }
    }
}

/// Blob bytes, wherever they live.
#[derive(Clone)]
pub struct BlobStore {
    backend: Arc<dyn Backend>,
}

impl std::fmt::Debug for BlobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlobStore({})", self.backend.objects())
    }
}

/// How long a local staged copy outlives its upload's answer (see [`BlobStore::discard`]).
const DISCARD_DELAY: std::time::Duration = std::time::Duration::from_secs(1);

impl BlobStore {
    /// Opens `file:///path` or `s3://bucket/prefix` (S3 settings from the `AWS_*` variables,
    /// then from `s3_options`). On an object store, up to `read_cache_bytes` of blob blocks are
    /// kept in memory for ranged reads (a file store has the kernel's page cache; below one
    /// block, 256 KiB, no cache).
    pub async fn open(url: &str, s3_options: &[(String, String)], read_cache_bytes: u64) -> anyhow::Result<Self> {
        let parsed = Url::parse(url).map_err(|e| anyhow::anyhow!("invalid blob store URL {url:?}: {e}"))?;
        let (scheme, prefix) = ObjectStoreScheme::parse(&parsed)
            .map_err(|e| anyhow::anyhow!("unsupported blob store URL {url:?}: {e}"))?;
        let backend: Arc<dyn Backend> = match scheme {
            ObjectStoreScheme::Local => Arc::new(LocalDisk::open(PathBuf::from(parsed.path())).await?),
            ObjectStoreScheme::AmazonS3 => {
                let bucket = parsed.host_str().unwrap_or_default();
                let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
                for (k, v) in s3_options {
                    let key = k.parse().map_err(|e| anyhow::anyhow!("S3 setting {k:?}: {e}"))?;
                    builder = builder.with_config(key, v);
                }
                let s3 = builder.build()?;
                let objects: Arc<dyn ObjectStore> =
                    if prefix.as_ref().is_empty() { Arc::new(s3) } else { Arc::new(PrefixStore::new(s3, prefix)) };
                Arc::new(ObjectBackend::open(objects, read_cache_bytes).await)
            }
            other => anyhow::bail!("unsupported blob store {other:?}: use file:// or s3://"),
        };
        Ok(Self { backend })
    }

    fn objects(&self) -> &Arc<dyn ObjectStore> {
        self.backend.objects()
    }

    /// Receives a body while hashing it. A body of at most [`INLINE_MAX`] bytes stays in
    /// memory (it is stored inline with its metadata, in the same commit); a larger one goes
    /// to a temporary location (on an object store, with `announced` the BLAKE3 digest the
    /// caller promised, straight to that key). Nothing is visible under a content key until
    /// [`BlobStore::publish`]; the temporary copy goes when the `Staged` is dropped.
    pub async fn stage<S, E>(
        &self,
        body: S,
        max: u64,
        size_hint: Option<u64>,
        announced: Option<Digest>,
    ) -> Result<Staged, BlobError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send,
        E: std::fmt::Display,
    {
        let mut body = std::pin::pin!(body);
        let mut hasher = blake3::Hasher::new();
        let mut sha = ShaHasher::Inline(Sha256::new());
        let mut index = LineIndexBuilder::default();
        // A body announced small enough to be inline is held in one allocation.
        let small = size_hint.filter(|&n| n <= INLINE_MAX as u64).unwrap_or(0) as usize;
        let mut held = Held::Memory(BytesMut::with_capacity(small));
        let received: Result<(), BlobError> = async {
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| BlobError::Body(e.to_string()))?;
                if index.size() + chunk.len() as u64 > max {
                    return Err(BlobError::TooLarge(max));
                }
                hasher.update(&chunk);
                index.update(&chunk);
                self.keep(&mut held, &chunk, announced).await?;
                sha.update(chunk, index.size()).await;
            }
            Ok(())
        }
        .await;
        if let Err(e) = received {
            self.settle(held, false).await?;
            return Err(e);
        }
        // SHA-256's last blocks (on its own thread, behind the body) and the staged file's
        // final flush run at once. A failed flush has removed what was staged; a failed hash
        // removes it here, before the error is answered.
        let (sha256, copy) = tokio::join!(sha.finish(), self.settle(held, true));
        let copy = copy?.ok_or_else(|| BlobError::storage("staging lost its data"))?;
        let sha256 = match sha256 {
            Ok(sha256) => sha256,
            Err(e) => {
                copy.remove().await;
                return Err(e);
            }
        };
        Ok(Staged {
            digest: Digest::from_bytes(*hasher.finalize().as_bytes()),
            sha256,
            size: index.size(),
            lines: index.lines(),
            index: index.finish(),
            copy,
        })
    }

    /// Keeps a chunk: in memory while the body fits the inline limit, then in a temporary
    /// file or object (what memory held goes there first).
    async fn keep(&self, held: &mut Held, chunk: &Bytes, announced: Option<Digest>) -> Result<(), BlobError> {
        match held {
            Held::Spilled(sink, _) => sink.write(chunk.clone()).await,
            Held::Memory(memory) if memory.len() + chunk.len() <= INLINE_MAX => {
                memory.extend_from_slice(chunk);
                Ok(())
            }
            Held::Memory(memory) => {
                let (mut sink, copy) = self.backend.open_sink(announced).await?;
                let mut wrote = sink.write(std::mem::take(memory).freeze()).await;
                if wrote.is_ok() {
                    wrote = sink.write(chunk.clone()).await;
                }
                if let Err(e) = wrote {
                    sink.abort().await;
                    copy.remove().await;
                    return Err(e);
                }
                *held = Held::Spilled(sink, copy);
                Ok(())
            }
        }
    }

    /// The staged copy once the body has ended: inline bytes, or the temporary file or
    /// object flushed. After a failure (`ok` false), nothing: the writer is aborted and what it
    /// wrote removed before the error is answered. (A request dropped mid-body never gets
    /// here; its guard removes the bytes.)
    async fn settle(&self, held: Held, ok: bool) -> Result<Option<Copy>, BlobError> {
        match (ok, held) {
            (false, Held::Spilled(sink, copy)) => {
                sink.abort().await;
                copy.remove().await;
                Ok(None)
            }
            (false, Held::Memory(_)) => Ok(None),
            (true, Held::Memory(memory)) => Ok(Some(Copy::Inline(memory.freeze()))),
            (true, Held::Spilled(sink, copy)) => {
                // A failed finish drops the copy, which removes it.
                sink.finish().await?;
                self.backend.syncs().fetch_add(1, Ordering::Relaxed);
                Ok(Some(Copy::Spilled(copy)))
            }
        }
    }

    /// Removes the temporary copy of staged bytes (published or not) and waits for it, so that
    /// an answer is sent after the clean-up. Dropping a `Staged` also removes it.
    pub async fn discard(&self, staged: Staged) {
        // A local copy is unlinked a while after the answer: freeing the blocks of a copy never
        // linked (its content was stored already) costs more than dropping the name of one that
        // was published, in this upload's commit or the next one's, and timing would tell the
        // two apart. A second later the cost falls on whatever upload happens to be running.
        // (A crash before leaves it in the staging directory, which startup empties.)
        if matches!(&staged.copy, Copy::Spilled(c) if c.removed_late()) {
            tokio::spawn(async move {
                tokio::time::sleep(DISCARD_DELAY).await;
                staged.copy.remove().await;
            });
            return;
        }
        staged.copy.remove().await;
    }

    /// Makes staged bytes readable under their content key. Idempotent: publishing bytes that
    /// are already there (a concurrent identical upload) succeeds.
    pub async fn publish(&self, staged: &Staged) -> Result<(), BlobError> {
        match self.publisher(staged) {
            Some(publish) => publish().await,
            None => Ok(()),
        }
    }

    /// What makes staged bytes readable under their content key, owning what it needs, so the
    /// caller can run it later — inside the transaction that references them (`Db::add_ref`).
    /// The staged copy must outlive it (the `Staged` is kept until the answer). `None` for
    /// inline bytes, which are stored with their row.
    pub fn publisher(&self, staged: &Staged) -> Option<Completion> {
        match &staged.copy {
            Copy::Inline(_) => None,
            Copy::Spilled(copy) => Some(copy.publisher(&staged.digest)),
        }
    }

    /// Files and directories uploads made durable so far (staged files' `fdatasync`, the
    /// blob directory's `fsync` at publication).
    pub fn syncs(&self) -> u64 {
        self.backend.syncs().load(Ordering::Relaxed)
    }

    /// Whether an upload whose digest is announced can be written straight to its content key
    /// (object stores: a multipart upload, completed after verification).
    pub fn writes_direct(&self) -> bool {
        self.backend.writes_direct()
    }

    /// Bytes `range` of a blob of `size` bytes.
    pub async fn get_range(&self, d: &Digest, size: u64, range: Range<u64>) -> Result<Bytes, BlobError> {
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        self.backend.read_blob(d, size, range).await
    }

    /// Starts fetching bytes `range` of blob `d` (of `size` bytes), which a scan will read
    /// next: on local disk the kernel's read-ahead is asked for them; an object store reads
    /// them now into its block cache, where the scan's own read finds them, or joins the fetch.
    pub fn read_ahead(&self, d: &Digest, size: u64, range: Range<u64>) {
        if !range.is_empty() {
            self.backend.clone().will_read(d, size, range);
        }
    }

    /// A blob (or a range of it) as a stream of chunks, for full downloads.
    pub async fn get_stream(&self, d: &Digest, range: Range<u64>) -> Result<ByteStream, BlobError> {
        self.backend.stream_blob(d, range).await
    }

    /// Deletes a blob's bytes; bytes that are already gone count as deleted.
    pub async fn delete(&self, d: &Digest) -> Result<(), BlobError> {
        let deleted = match self.objects().delete(&blob_key(d)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        };
        // After the unlink: a read that opened the file while it was being deleted may have
        // cached it, and would keep the space in use.
        self.backend.forget_blob(d);
        deleted
    }

    /// Every stored blob (not the inline ones): its digest, size and when its bytes were
    /// written, in milliseconds since the epoch. Keys that are not blobs are skipped; a twin
    /// name (`….dedup`) that a crash left between its link and its unlink is removed on the way
    /// (no read ever sees one, and a publisher that finds its twin gone carries on).
    pub fn list(&self) -> BoxStream<'_, Result<(Digest, u64, i64), BlobError>> {
        self.list_under(Path::from("blobs"))
    }

    /// [`BlobStore::list`] for the blobs under key prefix `prefix` (0–255, their digests'
    /// first byte): a 256th of the store, what one step of retention's sweep lists.
    pub fn list_prefix(&self, prefix: u8) -> BoxStream<'_, Result<(Digest, u64, i64), BlobError>> {
        self.list_under(Path::from(format!("blobs/{prefix:02x}")))
    }

    fn list_under(&self, at: Path) -> BoxStream<'_, Result<(Digest, u64, i64), BlobError>> {
        self.objects()
            .list(Some(&at))
            .filter_map(move |meta| async move {
                match meta {
                    Ok(m) => {
                        let name = m.location.filename()?;
                        if name.ends_with(".dedup") {
                            let _ = self.objects().delete(&m.location).await;
                            return None;
                        }
                        let d = Digest::from_hex(name)?;
                        Some(Ok((d, m.size, m.last_modified.timestamp_millis())))
                    }
                    Err(e) => Some(Err(e.into())),
                }
            })
            .boxed()
    }

    /// Writes bytes under a digest's key with no checks at all: what a crash between
    /// publication and the metadata row leaves behind, for the tests of the sweep.
    #[cfg(feature = "testing")]
    pub async fn plant(&self, d: &Digest, data: Bytes) -> Result<(), BlobError> {
        self.objects().put(&blob_key(d), data.into()).await?;
        Ok(())
    }

    /// Closes what this process holds open of blob `d`, so that the next read opens it afresh
    /// and reads what is stored now (the scrub: a descriptor kept open would read a replaced
    /// or deleted file's old bytes).
    pub fn reopen(&self, d: &Digest) {
        self.backend.forget_blob(d);
    }

    /// The same for a pack.
    pub fn reopen_pack(&self, id: &str) {
        self.backend.forget_pack(id);
    }

    /// True when the bytes of `d` are present (tests and repair).
    pub async fn exists(&self, d: &Digest) -> Result<bool, BlobError> {
        Ok(self.stored_size(&blob_key(d)).await?.is_some())
    }

    /// The size of blob `d`'s stored copy, `None` when there is none: what the scrub asks when a
    /// read fails, to tell a copy cut short (damage) from a store that failed (an error).
    pub async fn blob_size(&self, d: &Digest) -> Result<Option<u64>, BlobError> {
        self.stored_size(&blob_key(d)).await
    }

    /// The same for a pack.
    pub async fn pack_size(&self, id: &str) -> Result<Option<u64>, BlobError> {
        self.stored_size(&crate::storage::backend::pack_key(id)).await
    }

    async fn stored_size(&self, key: &Path) -> Result<Option<u64>, BlobError> {
        match self.objects().head(key).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes a pack of compressed chunks (`chunks.rs`) under its id, durably: it is stored
    /// once this returns (it is referenced, and raw copies removed, only after).
    pub async fn put_pack(&self, id: &str, data: Bytes) -> Result<(), BlobError> {
        self.backend.put_pack(id, data).await
    }

    /// Bytes `range` of a pack.
    pub async fn get_pack_range(&self, id: &str, range: Range<u64>) -> Result<Bytes, BlobError> {
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        self.backend.read_pack(id, range).await
    }

    /// Deletes a pack; one already gone counts as deleted.
    pub async fn delete_pack(&self, id: &str) -> Result<(), BlobError> {
        let deleted = match self.objects().delete(&crate::storage::backend::pack_key(id)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        };
        self.backend.forget_pack(id);
        deleted
    }

    /// Every stored pack: its id, size and when it was written (milliseconds since the epoch).
    pub fn list_packs(&self) -> BoxStream<'_, Result<(String, u64, i64), BlobError>> {
        self.list_packs_under(Path::from("packs"))
    }

    /// [`BlobStore::list_packs`] for the packs under key prefix `prefix` (their ids' first byte).
    pub fn list_packs_prefix(&self, prefix: u8) -> BoxStream<'_, Result<(String, u64, i64), BlobError>> {
        self.list_packs_under(Path::from(format!("packs/{prefix:02x}")))
    }

    fn list_packs_under(&self, at: Path) -> BoxStream<'_, Result<(String, u64, i64), BlobError>> {
        self.objects()
            .list(Some(&at))
            .filter_map(|meta| async move {
                match meta {
                    Ok(m) => {
                        let name = m.location.filename()?;
                        let valid = name.len() == 32 && name.bytes().all(|b| b.is_ascii_hexdigit());
                        valid.then(|| Ok((name.to_owned(), m.size, m.last_modified.timestamp_millis())))
                    }
                    Err(e) => Some(Err(e.into())),
                }
            })
            .boxed()
    }

    /// Checks that the store answers, for `/readyz`.
    /// Whether the store answers a listing of its blobs: bytes not found in a store that does
    /// are missing; in one that does not (a bucket gone, a directory unreadable), it is the
    /// store that is down (`503`), not the bytes (an object store answers both with a 404).
    pub async fn lists_blobs(&self) -> bool {
        !matches!(self.objects().list(Some(&Path::from("blobs"))).next().await, Some(Err(_)))
    }

    /// Whether the store answers at all (`/readyz`).
    pub async fn ping(&self) -> Result<(), BlobError> {
        match self.objects().head(&Path::from("readyz-probe")).await {
            Ok(_) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ranges_come_from_open_files_until_the_blob_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(&format!("file://{}", dir.path().display()), &[], 0).await.unwrap();
        let data: Bytes = (0..300_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into();
        let d = Digest::of(&data);
        store.plant_raw(&d, data.clone()).await;
        for range in [0..1, 1000..101_000, 299_999..300_000, 0..300_000] {
            let got = store.get_range(&d, 300_000, range.clone()).await.unwrap();
            assert_eq!(got, data.slice(range.start as usize..range.end as usize), "{range:?}");
        }
        // The file stays open for the next read: its name can go, the reads go on.
        std::fs::remove_file(dir.path().join(blob_key(&d).as_ref())).unwrap();
        assert_eq!(store.get_range(&d, 300_000, 0..10).await.unwrap(), data.slice(0..10));
        // Past the end is an error, never a short answer.
        assert!(store.get_range(&d, 300_000, 299_000..300_001).await.is_err());
        // A deletion closes the file: the bytes are gone for reads too.
        store.delete(&d).await.unwrap();
        assert!(matches!(store.get_range(&d, 300_000, 0..10).await, Err(BlobError::NotFound)));
    }

    impl BlobStore {
        async fn plant_raw(&self, d: &Digest, data: Bytes) {
            self.objects().put(&blob_key(d), data.into()).await.unwrap();
        }
    }
}
