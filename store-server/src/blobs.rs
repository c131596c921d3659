//! `BlobStore`: blob bytes over `object_store`, keyed by digest. Uploads are hashed (BLAKE3 on
//! the receiving task, SHA-256 on a blocking thread once the body is large) while they are
//! written to a unique temporary location (on local disk by a [`Spool`] thread, which starts
//! the writeback while the body arrives); they are published under the content key only after
//! the digest matches, and on local disk only after file and directory are fsynced.

use std::ops::Range;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreScheme};
use sha2::{Digest as _, Sha256};
use spillway_api::Digest;
use tokio::io::AsyncWriteExt;
use url::Url;

use spillway_api::paging::lines::{LineIndex, LineIndexBuilder};

use crate::cache::BlockCache;
use crate::clock::{Clock, SystemClock};
use crate::direct::{Parts, Pending};
use crate::spool::Spool;
use crate::staging::StagingDir;

/// Blobs up to this size are stored inline in their metadata row: one group commit makes
/// them durable, with no file and no fsync of their own.
pub const INLINE_MAX: usize = 16 << 10;
/// Above this many bytes SHA-256 moves to its own thread, off the receiving task.
const SHA_INLINE_LIMIT: u64 = 256 << 10;

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

/// Completes bytes written straight to their content key (see [`BlobStore::completion`]).
pub type Completion = Box<dyn FnOnce() -> futures::future::BoxFuture<'static, Result<(), BlobError>> + Send>;

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
    tmp: TmpGuard,
}

#[derive(Debug)]
enum Tmp {
    Local(PathBuf),
    Object(Path),
    /// Straight to the content key: an open multipart upload, completed by publication.
    Direct(Path, Pending),
    Inline(Bytes),
}

/// Where the bytes of a body being received are: in memory, or written to a temporary name.
enum Held {
    Memory(BytesMut),
    Spilled(Box<Sink>, TmpGuard),
}

/// Staged bytes under a temporary name, removed when the guard goes — on every path: a
/// failed upload, a dropped request, a published one (its final name is a link or a copy).
/// A direct upload not completed by then is aborted; a completed one is the blob and stays.
struct TmpGuard {
    tmp: Tmp,
    store: Arc<dyn ObjectStore>,
}

impl std::fmt::Debug for TmpGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.tmp.fmt(f)
    }
}

impl TmpGuard {
    /// Removes the temporary copy now and waits for it (the guard's drop only starts the
    /// removal of an object).
    async fn remove(mut self) {
        match std::mem::replace(&mut self.tmp, Tmp::Inline(Bytes::new())) {
            Tmp::Local(p) => {
                let _ = tokio::fs::remove_file(p).await;
            }
            Tmp::Object(p) => {
                let _ = self.store.delete(&p).await;
            }
            Tmp::Direct(_, upload) => upload.abort().await,
            Tmp::Inline(_) => {}
        }
    }
}

impl Drop for TmpGuard {
    fn drop(&mut self) {
        match &self.tmp {
            // Unlinking is one quick system call; an open writer keeps its inode until it closes.
            Tmp::Local(p) => {
                let _ = std::fs::remove_file(p);
            }
            Tmp::Object(p) => {
                let (store, p) = (self.store.clone(), p.clone());
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        let _ = store.delete(&p).await;
                    });
                }
            }
            Tmp::Direct(_, upload) => upload.abort_later(),
            Tmp::Inline(_) => {}
        }
    }
}

impl Staged {
    /// True when the bytes were written straight to their content key (completed by
    /// [`BlobStore::completion`], once).
    pub fn is_direct(&self) -> bool {
        matches!(self.tmp.tmp, Tmp::Direct(..))
    }

    /// The bytes, when the blob is small enough to be stored inline with its metadata.
    pub fn inline(&self) -> Option<&Bytes> {
        match &self.tmp.tmp {
            Tmp::Inline(b) => Some(b),
            _ => None,
        }
    }
}

enum Sink {
    Local(Spool),
    Object(object_store::buffered::BufWriter),
    Direct(Parts),
}

impl Sink {
    async fn write(&mut self, data: Bytes) -> Result<(), BlobError> {
        match self {
            Self::Local(f) => f.write(data).await?,
            Self::Object(w) => w.put(data).await?,
            Self::Direct(p) => p.write(data).await?,
        }
        Ok(())
    }

    /// Makes the bytes durable (local: fdatasync) or complete (object store upload; a direct
    /// upload has all its parts stored, and is completed by publication).
    async fn finish(self) -> Result<(), BlobError> {
        match self {
            Self::Local(f) => {
                f.finish().await?;
            }
            Self::Object(mut w) => w.shutdown().await?,
            Self::Direct(p) => p.finish().await?,
        }
        Ok(())
    }

    async fn abort(self) {
        match self {
            Self::Local(f) => f.abort().await,
            Self::Object(mut w) => {
                let _ = w.abort().await;
            }
            Self::Direct(p) => p.abort().await,
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
    store: Arc<dyn ObjectStore>,
    /// Set for `file://` stores: uploads go through plain files so they can be fsynced.
    local_root: Option<PathBuf>,
    /// `file://` stores: open blob files, for ranged reads.
    open_files: Arc<OpenFiles>,
    /// `file://` stores: open pack files.
    pack_files: Arc<OpenFiles<String>>,
    /// Object stores: blocks of blobs read lately (see [`BlobStore::with_read_cache`]).
    blocks: Option<Arc<BlockCache>>,
    /// `file://` stores: this process's directory for bodies being received.
    staging: Option<Arc<StagingDir>>,
    /// Files and directories made durable (fdatasync, fsync) by uploads: what tests compare
    /// to show that two paths cost the same.
    syncs: Arc<std::sync::atomic::AtomicU64>,
}

/// Most blob files kept open.
const OPEN_FILES_MAX: usize = 256;

/// Open blob (or pack) files by digest (or id), so that a capped read is one `pread` rather
/// than open, fstat, seek, read and close on the blocking pool. A digest names its content
/// and a pack is never rewritten, so a descriptor always reads the right bytes; a deletion
/// closes it, so that the space is freed.
#[derive(Debug)]
struct OpenFiles<K = Digest> {
    map: std::sync::Mutex<std::collections::HashMap<K, Arc<std::fs::File>>>,
}

impl<K> Default for OpenFiles<K> {
    fn default() -> Self {
        Self { map: Default::default() }
    }
}

impl<K: std::hash::Hash + Eq + Clone> OpenFiles<K> {
    fn get<Q: std::hash::Hash + Eq + ?Sized>(&self, d: &Q) -> Option<Arc<std::fs::File>>
    where
        K: std::borrow::Borrow<Q>,
    {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).get(d).cloned()
    }

    fn put(&self, d: K, file: Arc<std::fs::File>) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= OPEN_FILES_MAX {
            let any = map.keys().next().expect("a full map has a key").clone();
            map.remove(&any);
        }
        map.insert(d, file);
    }

    fn forget<Q: std::hash::Hash + Eq + ?Sized>(&self, d: &Q)
    where
        K: std::borrow::Borrow<Q>,
    {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).remove(d);
    }
}

/// Bytes of a local blob read at a time by a full download.
const DOWNLOAD_CHUNK: u64 = 512 << 10;

/// Bytes `range` of an open file: from the page cache on this thread when they are there (a
/// capped read of a busy blob never leaves the runtime), else on the blocking pool.
async fn read_at(file: Arc<std::fs::File>, range: Range<u64>) -> Result<Bytes, BlobError> {
    let mut buf = vec![0u8; (range.end - range.start) as usize];
    let done = read_cached(&file, &mut buf, range.start)?;
    if done < buf.len() {
        buf = tokio::task::spawn_blocking(move || {
            std::os::unix::fs::FileExt::read_exact_at(&*file, &mut buf[done..], range.start + done as u64)?;
            Ok::<_, std::io::Error>(buf)
        })
        .await??;
    }
    Ok(Bytes::from(buf))
}

/// Reads `buf.len()` bytes at `offset` from the page cache without blocking; returns how many
/// it read before the data was not cached (the rest is for a blocking read).
fn read_cached(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    use rustix::io::{preadv2, Errno, ReadWriteFlags};
    let mut done = 0;
    while done < buf.len() {
        let mut slices = [std::io::IoSliceMut::new(&mut buf[done..])];
        match preadv2(file, &mut slices, offset + done as u64, ReadWriteFlags::NOWAIT) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            // Not cached, or a kernel or file system without RWF_NOWAIT: the blocking pool.
            Err(Errno::AGAIN | Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL) => break,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(done)
}

impl std::fmt::Debug for BlobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlobStore({})", self.store)
    }
}

/// How long a local staged copy outlives its upload's answer (see [`BlobStore::discard`]).
const DISCARD_DELAY: std::time::Duration = std::time::Duration::from_secs(1);

fn blob_key(d: &Digest) -> Path {
    let hex = d.hex();
    Path::from(format!("blobs/{}/{hex}", &hex[..2]))
}

/// Where a pack of chunks is stored (`id`: 32 hex).
fn pack_key(id: &str) -> Path {
    Path::from(format!("packs/{}/{id}", &id[..2]))
}

/// Closes a directory made before (by an older version, or by hand) to other users.
pub(crate) async fn make_private(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = tokio::fs::metadata(dir).await?;
    if meta.permissions().mode() & 0o077 != 0 {
        tokio::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).await?;
    }
    Ok(())
}

fn fsync_dir(dir: &FsPath) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

impl BlobStore {
    /// Opens `file:///path` or `s3://bucket/prefix` (S3 settings from the `AWS_*` variables,
    /// then from `s3_options`).
    pub async fn open(url: &str, s3_options: &[(String, String)]) -> anyhow::Result<Self> {
        let parsed = Url::parse(url).map_err(|e| anyhow::anyhow!("invalid blob store URL {url:?}: {e}"))?;
        let (scheme, prefix) = ObjectStoreScheme::parse(&parsed)
            .map_err(|e| anyhow::anyhow!("unsupported blob store URL {url:?}: {e}"))?;
        match scheme {
            ObjectStoreScheme::Local => {
                let root = PathBuf::from(parsed.path());
                Self::open_local(root).await
            }
            ObjectStoreScheme::AmazonS3 => {
                let bucket = parsed.host_str().unwrap_or_default();
                let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
                for (k, v) in s3_options {
                    let key = k.parse().map_err(|e| anyhow::anyhow!("S3 setting {k:?}: {e}"))?;
                    builder = builder.with_config(key, v);
                }
                let s3 = builder.build()?;
                let store: Arc<dyn ObjectStore> =
                    if prefix.as_ref().is_empty() { Arc::new(s3) } else { Arc::new(PrefixStore::new(s3, prefix)) };
                let this = Self {
                    store,
                    local_root: None,
                    open_files: Arc::default(),
                    pack_files: Arc::default(),
                    blocks: None,
                    staging: None,
                    syncs: Arc::default(),
                };
                this.clean_object_tmp().await;
                Ok(this)
            }
            other => anyhow::bail!("unsupported blob store {other:?}: use file:// or s3://"),
        }
    }

    async fn open_local(root: PathBuf) -> anyhow::Result<Self> {
        tokio::fs::create_dir_all(&root).await?;
        make_private(&root).await?;
        // Leftovers of a dead process are never published; a live one's are kept.
        let tmp = root.join("tmp");
        let staging = tokio::task::spawn_blocking(move || StagingDir::create(&tmp)).await??;
        for i in 0..=255u8 {
            tokio::fs::create_dir_all(root.join("blobs").join(format!("{i:02x}"))).await?;
        }
        let r = root.clone();
        tokio::task::spawn_blocking(move || {
            fsync_dir(&r.join("blobs"))?;
            fsync_dir(&r)
        })
        .await??;
        let store = Arc::new(LocalFileSystem::new_with_prefix(&root)?);
        Ok(Self {
            store,
            local_root: Some(root),
            open_files: Arc::default(),
            pack_files: Arc::default(),
            blocks: None,
            staging: Some(Arc::new(staging)),
            syncs: Arc::default(),
        })
    }

    async fn clean_object_tmp(&self) {
        // Other replicas may be uploading right now: only old leftovers go. Compared with the
        // objects' own modification times, so the real clock, not the injected one.
        let cutoff = SystemClock.now_ms() / 1000 - 24 * 3600;
        let mut list = self.store.list(Some(&Path::from("tmp")));
        while let Some(Ok(meta)) = list.next().await {
            if meta.last_modified.timestamp() < cutoff {
                let _ = self.store.delete(&meta.location).await;
            }
        }
    }

    /// Opens the temporary location of a body that outgrew [`INLINE_MAX`]; on an object
    /// store, with its digest announced, a multipart upload to its content key instead.
    async fn open_sink(&self, announced: Option<Digest>) -> Result<(Sink, TmpGuard), BlobError> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let guard = |tmp| TmpGuard { tmp, store: self.store.clone() };
        Ok(match &self.staging {
            Some(staging) => {
                let path = staging.path().join(&id);
                let spool = Spool::create(&path).await?;
                (Sink::Local(spool), guard(Tmp::Local(path)))
            }
            None if announced.is_some() => {
                let key = blob_key(&announced.expect("announced"));
                let upload = Pending::new(self.store.put_multipart(&key).await?);
                (Sink::Direct(Parts::new(upload.clone())), guard(Tmp::Direct(key, upload)))
            }
            None => {
                let path = Path::from(format!("tmp/{id}"));
                let w = object_store::buffered::BufWriter::new(self.store.clone(), path.clone());
                (Sink::Object(w), guard(Tmp::Object(path)))
            }
        })
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
        let (sha256, tmp) = tokio::join!(sha.finish(), self.settle(held, true));
        let tmp = tmp?.ok_or_else(|| BlobError::storage("staging lost its data"))?;
        let sha256 = match sha256 {
            Ok(sha256) => sha256,
            Err(e) => {
                tmp.remove().await;
                return Err(e);
            }
        };
        Ok(Staged {
            digest: Digest::from_bytes(*hasher.finalize().as_bytes()),
            sha256,
            size: index.size(),
            lines: index.lines(),
            index: index.finish(),
            tmp,
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
                let (mut sink, tmp) = self.open_sink(announced).await?;
                let mut wrote = sink.write(std::mem::take(memory).freeze()).await;
                if wrote.is_ok() {
                    wrote = sink.write(chunk.clone()).await;
                }
                if let Err(e) = wrote {
                    sink.abort().await;
                    tmp.remove().await;
                    return Err(e);
                }
                *held = Held::Spilled(Box::new(sink), tmp);
                Ok(())
            }
        }
    }

    /// The staged copy once the body has ended: inline bytes, or the temporary file or
    /// object flushed. After a failure (`ok` false), nothing: the writer is aborted and what it
    /// wrote removed before the error is answered. (A request dropped mid-body never gets
    /// here; its guard removes the bytes.)
    async fn settle(&self, held: Held, ok: bool) -> Result<Option<TmpGuard>, BlobError> {
        match (ok, held) {
            (false, Held::Spilled(sink, tmp)) => {
                (*sink).abort().await;
                tmp.remove().await;
                Ok(None)
            }
            (false, Held::Memory(_)) => Ok(None),
            (true, Held::Memory(memory)) => {
                Ok(Some(TmpGuard { tmp: Tmp::Inline(memory.freeze()), store: self.store.clone() }))
            }
            (true, Held::Spilled(sink, tmp)) => {
                (*sink).finish().await?;
                self.syncs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(Some(tmp))
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
        if matches!(staged.tmp.tmp, Tmp::Local(_)) {
            tokio::spawn(async move {
                tokio::time::sleep(DISCARD_DELAY).await;
                staged.tmp.remove().await;
            });
            return;
        }
        staged.tmp.remove().await;
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
        let key = blob_key(&staged.digest);
        match (&staged.tmp.tmp, &self.local_root) {
            (Tmp::Local(tmp), Some(root)) => {
                let (tmp, dest, syncs) = (tmp.clone(), root.join(key.as_ref()), self.syncs.clone());
                Some(Box::new(move || {
                    Box::pin(async move {
                        let dir = dest.parent().map(FsPath::to_path_buf).unwrap_or_default();
                        tokio::task::spawn_blocking(move || {
                            match std::fs::hard_link(&tmp, &dest) {
                                Ok(()) => {}
                                // Stored already: the directory is changed all the same (a
                                // name linked and unlinked), so that its fsync commits as much
                                // as a new blob's and timing does not tell them apart. (A crash
                                // between the two leaves a `.dedup` name, which no read sees
                                // and the orphan sweep removes: `list`.)
                                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                                    let twin = dest.with_extension("dedup");
                                    if std::fs::hard_link(&tmp, &twin).is_ok() {
                                        let _ = std::fs::remove_file(&twin);
                                    }
                                }
                                Err(e) => return Err(e),
                            }
                            fsync_dir(&dir)
                        })
                        .await??;
                        syncs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        Ok(())
                    })
                }))
            }
            (Tmp::Object(tmp), _) => {
                let (store, tmp) = (self.store.clone(), tmp.clone());
                Some(Box::new(move || Box::pin(async move { Ok(store.copy(&tmp, &key).await?) })))
            }
            (Tmp::Direct(direct, upload), _) => {
                debug_assert_eq!(*direct, key);
                let upload = upload.clone();
                Some(Box::new(move || {
                    Box::pin(async move {
                        upload.complete().await?;
                        Ok(())
                    })
                }))
            }
            (Tmp::Inline(_), _) => None,
            (Tmp::Local(_), None) => {
                Some(Box::new(|| Box::pin(async { Err(BlobError::storage("local staging without a root")) })))
            }
        }
    }

    /// Files and directories uploads made durable so far (staged files' `fdatasync`, the
    /// blob directory's `fsync` at publication).
    pub fn syncs(&self) -> u64 {
        self.syncs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether an upload whose digest is announced can be written straight to its content key
    /// (object stores: a multipart upload, completed after verification).
    pub fn writes_direct(&self) -> bool {
        self.local_root.is_none()
    }

    /// Keeps up to `bytes` of blob blocks in memory for ranged reads, on an object store (a
    /// file store has the kernel's page cache). Below one block (256 KiB): no cache.
    pub fn with_read_cache(mut self, bytes: u64) -> Self {
        if self.local_root.is_none() {
            self.blocks = BlockCache::new(bytes).map(Arc::new);
        }
        self
    }

    /// Bytes `range` of a blob of `size` bytes.
    pub async fn get_range(&self, d: &Digest, size: u64, range: Range<u64>) -> Result<Bytes, BlobError> {
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let key = blob_key(d);
        let fetch = |r: Range<u64>| async { Ok::<_, BlobError>(self.store.get_range(&key, r).await?) };
        match (&self.local_root, &self.blocks) {
            (Some(root), _) => self.read_local(root, d, range).await,
            (None, Some(blocks)) if range.end <= size => blocks.read(d, size, range, fetch).await,
            (None, _) => fetch(range).await,
        }
    }

    /// A range of a local blob (see [`read_at`]).
    async fn read_local(&self, root: &FsPath, d: &Digest, range: Range<u64>) -> Result<Bytes, BlobError> {
        read_at(self.blob_file(root, d).await?, range).await
    }

    /// A local blob's file, from the open files or opened now (and kept).
    async fn blob_file(&self, root: &FsPath, d: &Digest) -> Result<Arc<std::fs::File>, BlobError> {
        if let Some(file) = self.open_files.get(d) {
            return Ok(file);
        }
        let path = root.join(blob_key(d).as_ref());
        let file = Arc::new(tokio::task::spawn_blocking(move || std::fs::File::open(path)).await??);
        self.open_files.put(*d, file.clone());
        Ok(file)
    }

    /// A blob (or a range of it) as a stream of chunks, for full downloads.
    pub async fn get_stream(
        &self,
        d: &Digest,
        range: Range<u64>,
    ) -> Result<BoxStream<'static, Result<Bytes, BlobError>>, BlobError> {
        if let Some(root) = &self.local_root {
            // Chunk after chunk with `read_at`: page-cache hits never leave the runtime.
            let file = self.blob_file(root, d).await?;
            let chunks = futures::stream::try_unfold(range, move |r| {
                let file = file.clone();
                async move {
                    if r.is_empty() {
                        return Ok(None);
                    }
                    let end = r.end.min(r.start + DOWNLOAD_CHUNK);
                    Ok(Some((read_at(file, r.start..end).await?, end..r.end)))
                }
            });
            return Ok(chunks.boxed());
        }
        let opts = object_store::GetOptions { range: Some(range.into()), ..Default::default() };
        let res = self.store.get_opts(&blob_key(d), opts).await?;
        Ok(res.into_stream().map_err(BlobError::from).boxed())
    }

    /// Deletes a blob's bytes; bytes that are already gone count as deleted.
    pub async fn delete(&self, d: &Digest) -> Result<(), BlobError> {
        let deleted = match self.store.delete(&blob_key(d)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        };
        // After the unlink: a read that opened the file while it was being deleted may have
        // cached it, and would keep the space in use.
        self.open_files.forget(d);
        deleted
    }

    /// Every stored blob (not the inline ones): its digest, size and when its bytes were
    /// written, in milliseconds since the epoch. Keys that are not blobs are skipped; a twin
    /// name (`….dedup`) that a crash left between its link and its unlink is removed on the way
    /// (no read ever sees one, and a publisher that finds its twin gone carries on).
    pub fn list(&self) -> BoxStream<'_, Result<(Digest, u64, i64), BlobError>> {
        self.store
            .list(Some(&Path::from("blobs")))
            .filter_map(move |meta| async move {
                match meta {
                    Ok(m) => {
                        let name = m.location.filename()?;
                        if name.ends_with(".dedup") {
                            let _ = self.store.delete(&m.location).await;
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
        self.store.put(&blob_key(d), data.into()).await?;
        Ok(())
    }

    /// True when the bytes of `d` are present (tests and repair).
    pub async fn exists(&self, d: &Digest) -> Result<bool, BlobError> {
        match self.store.head(&blob_key(d)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes a pack of compressed chunks (`chunks.rs`) under its id, durably: on disk the
    /// file and its directory are fsynced before this returns (it is referenced, and raw copies
    /// removed, only after); on S3 the PUT is acknowledged once stored.
    pub async fn put_pack(&self, id: &str, data: Bytes) -> Result<(), BlobError> {
        let key = pack_key(id);
        match &self.local_root {
            Some(root) => {
                let dest = root.join(key.as_ref());
                tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                    use std::io::Write;
                    let dir = dest.parent().expect("a pack has a directory").to_path_buf();
                    std::fs::create_dir_all(&dir)?;
                    let tmp = dir.join(format!(".{}.partial", uuid::Uuid::new_v4().simple()));
                    let written = (|| {
                        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
                        f.write_all(&data)?;
                        f.sync_data()?;
                        std::fs::rename(&tmp, &dest)?;
                        fsync_dir(&dir)
                    })();
                    if written.is_err() {
                        let _ = std::fs::remove_file(&tmp);
                    }
                    written
                })
                .await??;
                self.syncs.fetch_add(2, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            None => {
                self.store.put(&key, data.into()).await?;
                Ok(())
            }
        }
    }

    /// Bytes `range` of a pack.
    pub async fn get_pack_range(&self, id: &str, range: Range<u64>) -> Result<Bytes, BlobError> {
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        match &self.local_root {
            Some(root) => {
                let file = match self.pack_files.get(id) {
                    Some(f) => f,
                    None => {
                        let path = root.join(pack_key(id).as_ref());
                        let f = Arc::new(tokio::task::spawn_blocking(move || std::fs::File::open(path)).await??);
                        self.pack_files.put(id.to_owned(), f.clone());
                        f
                    }
                };
                read_at(file, range).await
            }
            None => Ok(self.store.get_range(&pack_key(id), range).await?),
        }
    }

    /// Deletes a pack; one already gone counts as deleted.
    pub async fn delete_pack(&self, id: &str) -> Result<(), BlobError> {
        let deleted = match self.store.delete(&pack_key(id)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        };
        self.pack_files.forget(id);
        deleted
    }

    /// Every stored pack: its id, size and when it was written (milliseconds since the epoch).
    pub fn list_packs(&self) -> BoxStream<'_, Result<(String, u64, i64), BlobError>> {
        self.store
            .list(Some(&Path::from("packs")))
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
    pub async fn ping(&self) -> Result<(), BlobError> {
        match self.store.head(&Path::from("readyz-probe")).await {
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
        let store = BlobStore::open_local(dir.path().to_path_buf()).await.unwrap();
        let data: Bytes = (0..300_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into();
        let d = Digest::of(&data);
        store.store.put(&blob_key(&d), data.clone().into()).await.unwrap();
        for range in [0..1, 1000..101_000, 299_999..300_000, 0..300_000] {
            let got = store.get_range(&d, 300_000, range.clone()).await.unwrap();
            assert_eq!(got, data.slice(range.start as usize..range.end as usize), "{range:?}");
        }
        assert!(store.open_files.get(&d).is_some(), "the file stays open for the next read");
        // Past the end is an error, never a short answer.
        assert!(store.get_range(&d, 300_000, 299_000..300_001).await.is_err());
        store.delete(&d).await.unwrap();
        assert!(store.open_files.get(&d).is_none(), "a deletion closes the file");
        assert!(matches!(store.get_range(&d, 300_000, 0..10).await, Err(BlobError::NotFound)));
    }
}
