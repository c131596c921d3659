//! Spill targets behind one trait: the remote store (a streaming upload of output whose length
//! is not known in advance) and a local directory (files named by content hash). Every wait on
//! a target is bounded by a [`Deadline`]: a slow or hanging store makes the spill fail, never
//! the tool call hang.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::{ClientError, Result};
use crate::store::{StoreClient, UploadOptions};

/// The 3-second rule: saving never waits longer than this by default.
pub const DEFAULT_SAVE_DEADLINE: Duration = Duration::from_secs(3);

/// Where a full output was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// In the store, by digest.
    Store {
        /// `blake3:…`.
        digest: String,
    },
    /// In a local file named by its content hash.
    File {
        /// The spill file, named by the output's BLAKE3.
        path: PathBuf,
        /// `blake3:…` of the content.
        digest: Option<String>,
    },
}

/// A budget of waiting shared by all the steps of one save (or of one turn's saves).
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    budget: Duration,
    started_wait: Option<Instant>,
    spent: Duration,
}

impl Deadline {
    /// A budget of `budget` total waiting.
    pub fn new(budget: Duration) -> Self {
        Self { budget, started_wait: None, spent: Duration::ZERO }
    }

    /// What is left.
    pub fn remaining(&self) -> Duration {
        self.budget.saturating_sub(self.spent)
    }

    /// Runs `fut`, charging the time it takes; fails when the budget runs out.
    pub async fn wait<T>(&mut self, fut: impl std::future::Future<Output = T>) -> Result<T> {
        let start = Instant::now();
        self.started_wait = Some(start);
        let out = tokio::time::timeout(self.remaining(), fut).await;
        self.spent += start.elapsed();
        self.started_wait = None;
        out.map_err(|_| ClientError::Timeout(self.budget))
    }
}

/// Something full outputs can be written to.
#[async_trait]
pub trait SpillTarget: Send + Sync + std::fmt::Debug {
    /// Starts writing one output; `labels` describe it (tool, stream, session).
    async fn begin(&self, labels: &[(String, String)]) -> Result<Box<dyn SpillWriter>>;

    /// Saves a whole output held in memory, under its content name.
    async fn save(&self, data: Bytes, labels: &[(String, String)], deadline: &mut Deadline) -> Result<Location> {
        let mut w = deadline.wait(self.begin(labels)).await??;
        w.write(data, deadline).await?;
        w.finish(deadline).await
    }
}

/// One output being written.
#[async_trait]
pub trait SpillWriter: Send {
    /// Appends bytes, waiting at most what is left of `deadline`.
    async fn write(&mut self, chunk: Bytes, deadline: &mut Deadline) -> Result<()>;
    /// Completes the write and says where it went.
    async fn finish(self: Box<Self>, deadline: &mut Deadline) -> Result<Location>;
}

/// A local directory: `<dir>/<blake3 hex>.txt`; the same content always lands on the same name.
#[derive(Debug, Clone)]
pub struct LocalDir {
    dir: PathBuf,
}

impl LocalDir {
    /// Spills into `dir` (created when needed).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        // Receipts carry absolute paths: the model may run the next tool elsewhere.
        Self { dir: std::path::absolute(&dir).unwrap_or(dir) }
    }

    /// The directory spills are written to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of the spill of a digest (`blake3:<hex>`), if it has the right form.
    pub fn path_of(&self, digest: &spillway_api::Digest) -> PathBuf {
        self.dir.join(format!("{}.txt", digest.hex()))
    }
}

/// Writes go to a 1 MiB buffer; full buffers are written by a blocking task while the next
/// fills (one write in flight), so the capture loop never waits on the disk twice.
struct LocalWriter {
    dir: PathBuf,
    tmp: PathBuf,
    file: Option<std::fs::File>,
    buf: Vec<u8>,
    pending: Option<PendingWrite>,
    hasher: blake3::Hasher,
}

const LOCAL_BUFFER: usize = 1 << 20;

/// The write in flight: it hands the file back when done.
type PendingWrite = tokio::task::JoinHandle<std::io::Result<(std::fs::File, Vec<u8>)>>;

impl LocalWriter {
    async fn wait_pending(&mut self) -> Result<()> {
        if let Some(p) = self.pending.take() {
            let (file, _written) = p.await.map_err(|e| ClientError::Other(e.to_string()))??;
            self.file = Some(file);
        }
        Ok(())
    }

    async fn flush_buf(&mut self) -> Result<()> {
        self.wait_pending().await?;
        let mut file = self.file.take().ok_or_else(|| ClientError::Other("spill file lost".into()))?;
        let data = std::mem::replace(&mut self.buf, Vec::with_capacity(LOCAL_BUFFER));
        self.pending = Some(tokio::task::spawn_blocking(move || {
            use std::io::Write;
            file.write_all(&data)?;
            Ok((file, data))
        }));
        Ok(())
    }
}

#[async_trait]
impl SpillTarget for LocalDir {
    async fn begin(&self, _labels: &[(String, String)]) -> Result<Box<dyn SpillWriter>> {
        tokio::fs::create_dir_all(&self.dir).await?;
        let tmp = self.dir.join(format!(".tmp-{}-{}", std::process::id(), rand_suffix()));
        let file = tokio::fs::File::create(&tmp).await?.into_std().await;
        Ok(Box::new(LocalWriter {
            dir: self.dir.clone(),
            tmp,
            file: Some(file),
            buf: Vec::with_capacity(LOCAL_BUFFER),
            pending: None,
            hasher: blake3::Hasher::new(),
        }))
    }
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("{t:x}-{}", N.fetch_add(1, Ordering::Relaxed))
}

#[async_trait]
impl SpillWriter for LocalWriter {
    async fn write(&mut self, chunk: Bytes, _deadline: &mut Deadline) -> Result<()> {
        self.hasher.update(&chunk);
        self.buf.extend_from_slice(&chunk);
        if self.buf.len() >= LOCAL_BUFFER {
            self.flush_buf().await?;
        }
        Ok(())
    }

    async fn finish(mut self: Box<Self>, _deadline: &mut Deadline) -> Result<Location> {
        self.flush_buf().await?;
        self.wait_pending().await?;
        let digest = spillway_api::Digest::from_bytes(*self.hasher.finalize().as_bytes());
        let path = self.dir.join(format!("{}.txt", digest.hex()));
        if tokio::fs::try_exists(&path).await.unwrap_or(false) {
            tokio::fs::remove_file(&self.tmp).await?; // same content, same name: nothing changes
        } else {
            tokio::fs::rename(&self.tmp, &path).await?;
        }
        Ok(Location::File { path, digest: Some(digest.to_string()) })
    }
}

impl Drop for LocalWriter {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.tmp); // abandoned or already renamed: both fine
    }
}

/// The remote store: a streaming `POST /v1/blobs` fed as the output is produced.
#[derive(Debug, Clone)]
pub struct RemoteStore {
    client: StoreClient,
    ttl: Option<u64>,
}

impl RemoteStore {
    /// Spills into the store behind `client`.
    pub fn new(client: StoreClient) -> Self {
        Self { client, ttl: None }
    }

    /// Sets the TTL of the references spills make.
    pub fn with_ttl(mut self, ttl: Option<u64>) -> Self {
        self.ttl = ttl;
        self
    }
}

/// Chunks in flight to the store; bounds the memory a slow store can pin.
const REMOTE_QUEUE: usize = 32;

struct RemoteWriter {
    client: StoreClient,
    /// Bytes handed to the upload so far.
    sent: u64,
    tx: Option<mpsc::Sender<std::io::Result<Bytes>>>,
    task: tokio::task::JoinHandle<Result<spillway_api::BlobRecord>>,
}

#[async_trait]
impl SpillTarget for RemoteStore {
    async fn begin(&self, labels: &[(String, String)]) -> Result<Box<dyn SpillWriter>> {
        let (tx, rx) = mpsc::channel(REMOTE_QUEUE);
        let client = self.client.clone();
        let opts = UploadOptions { ttl: self.ttl, labels: labels.to_vec(), max_bytes: None };
        let body = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
        let task = {
            let client = client.clone();
            tokio::spawn(async move { client.put_stream(body, &opts).await })
        };
        Ok(Box::new(RemoteWriter { client, sent: 0, tx: Some(tx), task }))
    }

    async fn save(&self, data: Bytes, labels: &[(String, String)], deadline: &mut Deadline) -> Result<Location> {
        let opts = UploadOptions { ttl: self.ttl, labels: labels.to_vec(), max_bytes: None };
        let rec = deadline.wait(self.client.put(data, &opts)).await??;
        Ok(Location::Store { digest: rec.digest.to_string() })
    }
}

impl RemoteWriter {
    /// How the upload ended, once its body is closed: the record, or why the store did not
    /// take it (a refused token, a size limit, a refused connection), which is what the
    /// receipt must name.
    async fn outcome(&mut self, deadline: &mut Deadline) -> Result<spillway_api::BlobRecord> {
        self.tx = None;
        match deadline.wait(&mut self.task).await {
            Ok(Ok(Ok(rec))) => Ok(rec),
            // The store may refuse a request before reading its body (a bad token, a size it
            // will not take) and close the connection while the body is still being sent; the
            // client then sees a broken connection, not the answer. Ask the store why.
            Ok(Ok(Err(e @ ClientError::Http(_)))) => Err(match deadline.wait(self.client.check_access()).await {
                Ok(Err(refused @ ClientError::Api { .. })) => refused,
                Ok(Ok(Some(limit))) if self.sent > limit => ClientError::Api {
                    status: 413,
                    code: spillway_api::ErrorCode::TooLarge,
                    message: format!("the output passed the store's limit of {limit} bytes"),
                },
                _ => e,
            }),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(join)) => Err(ClientError::Other(format!("the upload task failed: {join}"))),
            Err(timeout) => Err(timeout),
        }
    }

    /// The upload ended before the output did: why.
    async fn early_end(&mut self, deadline: &mut Deadline) -> ClientError {
        match self.outcome(deadline).await {
            Ok(_) => ClientError::Other("the store answered before the output was complete".into()),
            Err(e) => e,
        }
    }
}

#[async_trait]
impl SpillWriter for RemoteWriter {
    async fn write(&mut self, chunk: Bytes, deadline: &mut Deadline) -> Result<()> {
        let Some(tx) = self.tx.as_ref() else {
            return Err(ClientError::Other("the upload already failed".into()));
        };
        if self.task.is_finished() {
            return Err(self.early_end(deadline).await);
        }
        let len = chunk.len() as u64;
        match deadline.wait(tx.send(Ok(chunk))).await? {
            Ok(()) => {
                self.sent += len;
                Ok(())
            }
            Err(_) => Err(self.early_end(deadline).await),
        }
    }

    async fn finish(mut self: Box<Self>, deadline: &mut Deadline) -> Result<Location> {
        // A refusal can also surface only here, when the whole output was queued before the
        // store answered (a slow store): it is diagnosed the same way.
        let rec = self.outcome(deadline).await?;
        Ok(Location::Store { digest: rec.digest.to_string() })
    }
}

impl Drop for RemoteWriter {
    fn drop(&mut self) {
        self.task.abort(); // an abandoned upload is cut off; the store keeps nothing partial
    }
}
