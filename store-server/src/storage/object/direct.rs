//! Uploads whose BLAKE3 digest is announced, on an object store: written straight to their
//! content key as a multipart upload while the body arrives, and completed only after the
//! digest matched — no temporary object and no server-side copy. Until completion nothing is
//! visible under the key; a mismatch or a failure aborts the upload. (A crash leaves an
//! incomplete multipart upload, invisible to readers; S3's `AbortIncompleteMultipartUpload`
//! lifecycle rule reclaims its parts.)

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use object_store::{MultipartUpload, PutPayloadMut};
use tokio::task::JoinSet;

/// A failure of this module's own (not of the store), as the store's error type.
fn ended(what: &str, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> object_store::Error {
    object_store::Error::Generic { store: "multipart", source: format!("{what}: {}", source.into()).into() }
}

/// Bytes per part (S3 wants at least 5 MiB for every part but the last).
const PART_SIZE: usize = 8 << 20;
/// Parts uploading at once for one body; the receiving task waits beyond that, so one upload
/// holds at most `(PARTS_IN_FLIGHT + 1) * PART_SIZE` bytes.
const PARTS_IN_FLIGHT: usize = 2;

/// The multipart upload, shared by the writer (which adds parts) and the staged blob's guard
/// (which completes or aborts it). `None` once completed or aborted.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pending(Arc<Mutex<Option<Box<dyn MultipartUpload>>>>);

impl Pending {
    pub(crate) fn new(upload: Box<dyn MultipartUpload>) -> Self {
        Self(Arc::new(Mutex::new(Some(upload))))
    }

    fn take(&self) -> Option<Box<dyn MultipartUpload>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Makes the object visible under its key. `Ok(false)`: completed (or aborted) before.
    pub(crate) async fn complete(&self) -> object_store::Result<bool> {
        let Some(mut upload) = self.take() else { return Ok(false) };
        match upload.complete().await {
            Ok(_) => Ok(true),
            Err(e) => {
                let _ = upload.abort().await;
                Err(e)
            }
        }
    }

    /// Drops the parts; nothing becomes visible. Does nothing once completed.
    pub(crate) async fn abort(&self) {
        if let Some(mut upload) = self.take() {
            let _ = upload.abort().await;
        }
    }

    /// [`Pending::abort`] without waiting (for a guard being dropped).
    pub(crate) fn abort_later(&self) {
        if let (Some(mut upload), Ok(rt)) = (self.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(async move {
                let _ = upload.abort().await;
            });
        }
    }
}

/// The writer: collects chunks into parts (without copying them) and uploads each part as it
/// fills, a few at a time.
#[derive(Debug)]
pub(crate) struct Parts {
    upload: Pending,
    part: PutPayloadMut,
    in_flight: JoinSet<object_store::Result<()>>,
}

impl Parts {
    pub(crate) fn new(upload: Pending) -> Self {
        Self { upload, part: PutPayloadMut::new(), in_flight: JoinSet::new() }
    }

    pub(crate) async fn write(&mut self, chunk: Bytes) -> object_store::Result<()> {
        self.part.push(chunk);
        if self.part.content_length() >= PART_SIZE {
            self.send_part().await?;
        }
        Ok(())
    }

    async fn send_part(&mut self) -> object_store::Result<()> {
        let payload = std::mem::take(&mut self.part).freeze();
        let put = {
            let mut guard = self.upload.0.lock().unwrap_or_else(|e| e.into_inner());
            let upload = guard.as_mut().ok_or_else(|| ended("adding a part", "the upload already ended"))?;
            upload.put_part(payload)
        };
        self.in_flight.spawn(put);
        while self.in_flight.len() > PARTS_IN_FLIGHT {
            self.wait_one().await?;
        }
        Ok(())
    }

    async fn wait_one(&mut self) -> object_store::Result<()> {
        match self.in_flight.join_next().await {
            Some(done) => done.map_err(|e| ended("uploading a part", e))?,
            None => Ok(()),
        }
    }

    /// Uploads the last part and waits for every part. The upload stays open: completing it
    /// is [`Pending::complete`], after verification.
    pub(crate) async fn finish(mut self) -> object_store::Result<()> {
        if self.part.content_length() > 0 {
            self.send_part().await?;
        }
        while !self.in_flight.is_empty() {
            self.wait_one().await?;
        }
        Ok(())
    }

    /// Stops the parts in flight and aborts the upload.
    pub(crate) async fn abort(mut self) {
        self.in_flight.shutdown().await;
        self.upload.abort().await;
    }
}
