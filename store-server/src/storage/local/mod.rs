//! Local disk: plain files under one root, each made durable before it is named (file
//! fdatasync, directory fsync), read by `pread` from descriptors kept open.

use std::ops::Range;
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use object_store::local::LocalFileSystem;
use object_store::ObjectStore;
use spillway_api::Digest;

use self::spool::Spool;
use self::staging::StagingDir;
use crate::storage::backend::{blob_key, pack_key, Backend, BlobError, ByteStream, Completion, Sink, Spilled};

pub(crate) mod reserve;
mod spool;
mod staging;

/// Most blob (or pack) files kept open.
const OPEN_FILES_MAX: usize = 256;

/// Bytes of a local blob read at a time by a full download.
const DOWNLOAD_CHUNK: u64 = 512 << 10;

/// Blob and pack files under `root`.
#[derive(Debug)]
pub(crate) struct LocalDisk {
    objects: Arc<dyn ObjectStore>,
    root: PathBuf,
    /// This process's directory for bodies being received.
    staging: StagingDir,
    /// Open blob files, for ranged reads.
    open_files: OpenFiles<Digest>,
    /// Open pack files.
    pack_files: OpenFiles<String>,
    syncs: Arc<AtomicU64>,
}

/// Closes a directory made before (by an older version, or by hand) to other users.
pub(crate) async fn make_private(dir: &FsPath) -> std::io::Result<()> {
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

impl LocalDisk {
    /// Opens (or makes) a store under `root`; leftovers of a dead process are removed, a live
    /// one's are kept.
    pub(crate) async fn open(root: PathBuf) -> anyhow::Result<Self> {
        tokio::fs::create_dir_all(&root).await?;
        make_private(&root).await?;
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
        Ok(Self {
            objects: Arc::new(LocalFileSystem::new_with_prefix(&root)?),
            root,
            staging,
            open_files: OpenFiles::default(),
            pack_files: OpenFiles::default(),
            syncs: Arc::default(),
        })
    }

    /// A file under the root, from the open files or opened now (and kept).
    async fn file<K: std::hash::Hash + Eq + Clone>(
        &self,
        open: &OpenFiles<K>,
        key: K,
        rel: object_store::path::Path,
    ) -> Result<Arc<std::fs::File>, BlobError> {
        if let Some(file) = open.get(&key) {
            return Ok(file);
        }
        let path = self.root.join(rel.as_ref());
        let file = Arc::new(tokio::task::spawn_blocking(move || std::fs::File::open(path)).await??);
        open.put(key, file.clone());
        Ok(file)
    }
}

#[async_trait]
impl Backend for LocalDisk {
    fn objects(&self) -> &Arc<dyn ObjectStore> {
        &self.objects
    }

    fn syncs(&self) -> &AtomicU64 {
        &self.syncs
    }

    async fn open_sink(&self, _announced: Option<Digest>) -> Result<(Box<dyn Sink>, Box<dyn Spilled>), BlobError> {
        let path = self.staging.path().join(uuid::Uuid::new_v4().simple().to_string());
        let spool = Spool::create(&path).await?;
        let copy = StagedFile { path: Some(path), root: self.root.clone(), syncs: self.syncs.clone() };
        Ok((Box::new(SpoolSink(spool)), Box::new(copy)))
    }

    fn writes_direct(&self) -> bool {
        false
    }

    async fn read_blob(&self, d: &Digest, _size: u64, range: Range<u64>) -> Result<Bytes, BlobError> {
        read_at(self.file(&self.open_files, *d, blob_key(d)).await?, range).await
    }

    async fn stream_blob(&self, d: &Digest, range: Range<u64>) -> Result<ByteStream, BlobError> {
        // Chunk after chunk with `read_at`: page-cache hits never leave the runtime.
        let file = self.file(&self.open_files, *d, blob_key(d)).await?;
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
        Ok(chunks.boxed())
    }

    async fn read_pack(&self, id: &str, range: Range<u64>) -> Result<Bytes, BlobError> {
        read_at(self.file(&self.pack_files, id.to_owned(), pack_key(id)).await?, range).await
    }

    /// The file and its directory are fsynced before this returns (it is referenced, and raw
    /// copies removed, only after).
    async fn put_pack(&self, id: &str, data: Bytes) -> Result<(), BlobError> {
        let dest = self.root.join(pack_key(id).as_ref());
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
        self.syncs.fetch_add(2, Ordering::Relaxed);
        Ok(())
    }

    /// The kernel reads the range into the page cache in the background (`POSIX_FADV_WILLNEED`
    /// on the blob's file, opened and kept for the read to come): a scan's next window, or next
    /// output, is then a copy out of memory, even cold.
    fn will_read(self: Arc<Self>, d: &Digest, _size: u64, range: Range<u64>) {
        let d = *d;
        tokio::spawn(async move {
            if let Ok(file) = self.file(&self.open_files, d, blob_key(&d)).await {
                let len = std::num::NonZeroU64::new(range.end - range.start);
                let _ = rustix::fs::fadvise(&*file, range.start, len, rustix::fs::Advice::WillNeed);
            }
        });
    }

    fn forget_blob(&self, d: &Digest) {
        self.open_files.forget(d);
    }

    fn forget_pack(&self, id: &str) {
        self.pack_files.forget(id);
    }
}

/// A body written to a staging file by a [`Spool`] thread (which starts the writeback while
/// the body arrives).
struct SpoolSink(Spool);

#[async_trait]
impl Sink for SpoolSink {
    async fn write(&mut self, data: Bytes) -> Result<(), BlobError> {
        Ok(self.0.write(data).await?)
    }

    async fn finish(self: Box<Self>) -> Result<(), BlobError> {
        self.0.finish().await?;
        Ok(())
    }

    async fn abort(self: Box<Self>) {
        self.0.abort().await
    }
}

/// A staged file, published by a hard link to its content name.
#[derive(Debug)]
struct StagedFile {
    /// `None` once removed.
    path: Option<PathBuf>,
    root: PathBuf,
    syncs: Arc<AtomicU64>,
}

#[async_trait]
impl Spilled for StagedFile {
    fn publisher(&self, digest: &Digest) -> Completion {
        let tmp = self.path.clone().expect("a staged file is published before it is removed");
        let (dest, syncs) = (self.root.join(blob_key(digest).as_ref()), self.syncs.clone());
        Box::new(move || {
            Box::pin(async move {
                let dir = dest.parent().map(FsPath::to_path_buf).unwrap_or_default();
                tokio::task::spawn_blocking(move || {
                    match std::fs::hard_link(&tmp, &dest) {
                        // Stored already: nothing to link.
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(e),
                        Ok(()) => {}
                    }
                    // Either way a second name is linked and unlinked: stored already, the
                    // directory is changed all the same, so that its fsync commits as much
                    // as a new blob's; new, it makes the same system calls. Timing does not
                    // tell the two apart. (A crash between the two leaves a `.dedup` name,
                    // which no read sees and the orphan sweep removes: `BlobStore::list`.)
                    let twin = dest.with_extension("dedup");
                    if std::fs::hard_link(&tmp, &twin).is_ok() {
                        let _ = std::fs::remove_file(&twin);
                    }
                    fsync_dir(&dir)
                })
                .await??;
                syncs.fetch_add(1, Ordering::Relaxed);
                Ok(())
            })
        })
    }

    /// Freeing the blocks of a copy never linked (its content was stored already) costs more
    /// than dropping the name of one that was published, and timing would tell the two apart.
    fn removed_late(&self) -> bool {
        true
    }

    async fn remove(mut self: Box<Self>) {
        if let Some(p) = self.path.take() {
            let _ = tokio::fs::remove_file(p).await;
        }
    }
}

impl Drop for StagedFile {
    fn drop(&mut self) {
        // Unlinking is one quick system call; an open writer keeps its inode until it closes.
        if let Some(p) = self.path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Open files by digest (or pack id), so that a capped read is one `pread` rather than open,
/// fstat, seek, read and close on the blocking pool. A digest names its content and a pack is
/// never rewritten, so a descriptor always reads the right bytes; a deletion closes it, so
/// that the space is freed.
#[derive(Debug)]
struct OpenFiles<K> {
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
