//! Object storage (S3 through `object_store`): an announced upload is a multipart upload
//! straight to its content key, completed once verified; any other body goes to a temporary
//! object, copied to its key at publication. Ranged reads of blobs go through a block cache.

use std::ops::Range;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::ObjectStore;
use spillway_api::Digest;
use tokio::io::AsyncWriteExt;

use self::cache::BlockCache;
use self::direct::{Parts, Pending};
use crate::clock::{Clock, SystemClock};
use crate::storage::backend::{blob_key, pack_key, Backend, BlobError, ByteStream, Completion, Sink, Spilled};

pub(crate) mod cache;
mod direct;

/// Blobs and packs as objects of one store (a bucket, or a prefix of one).
#[derive(Debug)]
pub(crate) struct ObjectBackend {
    objects: Arc<dyn ObjectStore>,
    /// Blocks of blobs read lately; `None` when the cache is smaller than one block.
    blocks: Option<Arc<BlockCache>>,
    syncs: AtomicU64,
}

impl ObjectBackend {
    /// Opens `objects`, keeping up to `read_cache_bytes` of blob blocks in memory, and removes
    /// temporary objects left a day ago or more by dead uploads.
    pub(crate) async fn open(objects: Arc<dyn ObjectStore>, read_cache_bytes: u64) -> Self {
        let this = Self { objects, blocks: BlockCache::new(read_cache_bytes).map(Arc::new), syncs: AtomicU64::new(0) };
        this.clean_tmp().await;
        this
    }

    async fn clean_tmp(&self) {
        // Other replicas may be uploading right now: only old leftovers go. Compared with the
        // objects' own modification times, so the real clock, not the injected one.
        let cutoff = SystemClock.now_ms() / 1000 - 24 * 3600;
        let mut list = self.objects.list(Some(&Path::from("tmp")));
        while let Some(Ok(meta)) = list.next().await {
            if meta.last_modified.timestamp() < cutoff {
                let _ = self.objects.delete(&meta.location).await;
            }
        }
    }
}

#[async_trait]
impl Backend for ObjectBackend {
    fn objects(&self) -> &Arc<dyn ObjectStore> {
        &self.objects
    }

    fn syncs(&self) -> &AtomicU64 {
        &self.syncs
    }

    async fn open_sink(&self, announced: Option<Digest>) -> Result<(Box<dyn Sink>, Box<dyn Spilled>), BlobError> {
        Ok(match announced {
            Some(d) => {
                let key = blob_key(&d);
                let upload = Pending::new(self.objects.put_multipart(&key).await?);
                let copy = DirectUpload { key, upload: Some(upload.clone()) };
                (Box::new(PartsSink(Parts::new(upload))), Box::new(copy))
            }
            None => {
                let path = Path::from(format!("tmp/{}", uuid::Uuid::new_v4().simple()));
                let w = object_store::buffered::BufWriter::new(self.objects.clone(), path.clone());
                (Box::new(ObjectSink(w)), Box::new(TmpObject { path: Some(path), objects: self.objects.clone() }))
            }
        })
    }

    fn writes_direct(&self) -> bool {
        true
    }

    async fn read_blob(&self, d: &Digest, size: u64, range: Range<u64>) -> Result<Bytes, BlobError> {
        let key = blob_key(d);
        let fetch = |r: Range<u64>| async { Ok::<_, BlobError>(self.objects.get_range(&key, r).await?) };
        match &self.blocks {
            Some(blocks) if range.end <= size => blocks.read(d, size, range, fetch).await,
            _ => fetch(range).await,
        }
    }

    async fn stream_blob(&self, d: &Digest, range: Range<u64>) -> Result<ByteStream, BlobError> {
        let opts = object_store::GetOptions { range: Some(range.into()), ..Default::default() };
        let res = self.objects.get_opts(&blob_key(d), opts).await?;
        Ok(res.into_stream().map_err(BlobError::from).boxed())
    }

    /// Read into the block cache by a task of its own; without a cache, nothing (the bytes
    /// would be fetched twice).
    fn will_read(self: Arc<Self>, d: &Digest, size: u64, range: Range<u64>) {
        let Some(blocks) = self.blocks.clone() else { return };
        if range.start >= size.min(range.end) {
            return;
        }
        let (objects, d) = (self.objects.clone(), *d);
        tokio::spawn(async move {
            let key = blob_key(&d);
            let fetch = |r: Range<u64>| async { Ok::<_, BlobError>(objects.get_range(&key, r).await?) };
            let _ = blocks.read(&d, size, range.start..range.end.min(size), fetch).await;
        });
    }

    async fn read_pack(&self, id: &str, range: Range<u64>) -> Result<Bytes, BlobError> {
        Ok(self.objects.get_range(&pack_key(id), range).await?)
    }

    /// The PUT is acknowledged once the object is stored.
    async fn put_pack(&self, id: &str, data: Bytes) -> Result<(), BlobError> {
        self.objects.put(&pack_key(id), data.into()).await?;
        Ok(())
    }
}

/// A body written as the parts of a multipart upload to its content key.
struct PartsSink(Parts);

#[async_trait]
impl Sink for PartsSink {
    async fn write(&mut self, data: Bytes) -> Result<(), BlobError> {
        Ok(self.0.write(data).await?)
    }

    async fn finish(self: Box<Self>) -> Result<(), BlobError> {
        Ok(self.0.finish().await?)
    }

    async fn abort(self: Box<Self>) {
        self.0.abort().await
    }
}

/// A body written to a temporary object.
struct ObjectSink(object_store::buffered::BufWriter);

#[async_trait]
impl Sink for ObjectSink {
    async fn write(&mut self, data: Bytes) -> Result<(), BlobError> {
        Ok(self.0.put(data).await?)
    }

    async fn finish(mut self: Box<Self>) -> Result<(), BlobError> {
        Ok(self.0.shutdown().await?)
    }

    async fn abort(mut self: Box<Self>) {
        let _ = self.0.abort().await;
    }
}

/// A multipart upload to the content key, completed by its publication (after the digest is
/// verified) and aborted if it goes unpublished.
#[derive(Debug)]
struct DirectUpload {
    key: Path,
    /// `None` once removed.
    upload: Option<Pending>,
}

#[async_trait]
impl Spilled for DirectUpload {
    fn publisher(&self, digest: &Digest) -> Completion {
        debug_assert_eq!(self.key, blob_key(digest));
        let upload = self.upload.clone().expect("an upload is published before it is removed");
        Box::new(move || {
            Box::pin(async move {
                upload.complete().await?;
                Ok(())
            })
        })
    }

    fn is_direct(&self) -> bool {
        true
    }

    async fn remove(mut self: Box<Self>) {
        if let Some(upload) = self.upload.take() {
            upload.abort().await;
        }
    }
}

impl Drop for DirectUpload {
    fn drop(&mut self) {
        if let Some(upload) = self.upload.take() {
            upload.abort_later();
        }
    }
}

/// A temporary object, copied to the content key at publication.
#[derive(Debug)]
struct TmpObject {
    /// `None` once removed.
    path: Option<Path>,
    objects: Arc<dyn ObjectStore>,
}

#[async_trait]
impl Spilled for TmpObject {
    fn publisher(&self, digest: &Digest) -> Completion {
        let tmp = self.path.clone().expect("a copy is published before it is removed");
        let (objects, key) = (self.objects.clone(), blob_key(digest));
        Box::new(move || Box::pin(async move { Ok(objects.copy(&tmp, &key).await?) }))
    }

    async fn remove(mut self: Box<Self>) {
        if let Some(p) = self.path.take() {
            let _ = self.objects.delete(&p).await;
        }
    }
}

impl Drop for TmpObject {
    fn drop(&mut self) {
        if let Some(p) = self.path.take() {
            let objects = self.objects.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = objects.delete(&p).await;
                });
            }
        }
    }
}
