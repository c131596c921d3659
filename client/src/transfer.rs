//! Whole-blob transfers for SREs: `get` (verified against the digest before the file appears)
//! and `put` (streamed, with a progress bar on a terminal), to the store or a local directory.

use std::io::Write;
use std::path::{Path, PathBuf};

use futures::StreamExt;
use sha2::Digest as _;
use spillway_api::{AnyDigest, BlobRecord};
use tokio::io::AsyncReadExt;

use crate::error::{ClientError, Result};
use crate::reader::Reader;
use crate::spill::{Deadline, LocalDir, Location, SpillTarget};
use crate::store::{StoreClient, UploadOptions};

/// What `put` uploads.
#[derive(Debug, Clone)]
pub enum Source {
    /// A file, named in errors.
    File(PathBuf),
    /// Standard input.
    Stdin,
}

type BoxReader = Box<dyn tokio::io::AsyncRead + Send + Sync + Unpin>;

impl Source {
    async fn open(&self) -> Result<(BoxReader, Option<u64>)> {
        match self {
            Self::File(p) => {
                let f = tokio::fs::File::open(p).await.map_err(|e| ClientError::file(p, e))?;
                let len = f.metadata().await.map_err(|e| ClientError::file(p, e))?.len();
                Ok((Box::new(f), Some(len)))
            }
            Self::Stdin => Ok((Box::new(tokio::io::stdin()), None)),
        }
    }
}

/// A progress bar on stderr, drawn only when stderr is a terminal.
fn progress(len: Option<u64>) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::with_draw_target(len, indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bytes}/{total_bytes} {wide_bar} {bytes_per_sec} {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

/// Uploads to the store, streamed (`POST /v1/blobs`), with a progress bar.
pub async fn put_store(store: &StoreClient, source: Source, opts: &UploadOptions) -> Result<BlobRecord> {
    let (reader, len) = source.open().await?;
    let bar = progress(len);
    let counted = bar.wrap_async_read(reader);
    let body = tokio_util::io::ReaderStream::with_capacity(counted, 256 * 1024);
    let rec = store.put_stream(body, opts).await;
    bar.finish_and_clear();
    rec
}

/// Copies into a local directory of spills and answers a blob record plus the file's path.
pub async fn put_local(dir: &LocalDir, source: Source, opts: &UploadOptions) -> Result<serde_json::Value> {
    let (mut reader, len) = source.open().await?;
    let bar = progress(len);
    let mut data = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = reader.read(&mut buf).await.map_err(|e| match &source {
            Source::File(p) => ClientError::file(p, e),
            Source::Stdin => ClientError::Io(e),
        })?;
        if n == 0 {
            break;
        }
        data.extend_from_slice(&buf[..n]);
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    let sha256 = spillway_api::Sha256Digest::from_bytes(sha2::Sha256::digest(&data).into());
    let (size, lines) = (data.len() as u64, spillway_api::count_lines(&data));
    let existed = dir.path_of(&spillway_api::Digest::of(&data)).exists();
    let mut deadline = Deadline::new(std::time::Duration::from_secs(3600));
    let Location::File { path, digest } = dir.save(data.into(), &opts.labels, &mut deadline).await? else {
        return Err(ClientError::Other("a local directory saves files".into()));
    };
    Ok(serde_json::json!({
        "digest": digest, "sha256": sha256.to_string(), "size": size, "lines": lines,
        "deduplicated": existed, "expires_at": null, "file_path": path,
    }))
}

enum Hasher {
    Blake3(Box<blake3::Hasher>),
    Sha256(sha2::Sha256),
}

impl Hasher {
    fn for_digest(d: &AnyDigest) -> Self {
        match d {
            AnyDigest::Blake3(_) => Self::Blake3(Box::default()),
            AnyDigest::Sha256(_) => Self::Sha256(sha2::Sha256::new()),
        }
    }

    fn update(&mut self, b: &[u8]) {
        match self {
            Self::Blake3(h) => {
                h.update(b);
            }
            Self::Sha256(h) => h.update(b),
        }
    }

    fn finish(self) -> String {
        match self {
            Self::Blake3(h) => spillway_api::Digest::from_bytes(*h.finalize().as_bytes()).to_string(),
            Self::Sha256(h) => spillway_api::Sha256Digest::from_bytes(h.finalize().into()).to_string(),
        }
    }
}

/// Checks bytes, as they arrive, against the digest they were asked by.
pub struct Verifier {
    expected: AnyDigest,
    hasher: Hasher,
}

impl Verifier {
    /// A check of the bytes of `d`.
    pub fn new(d: &AnyDigest) -> Self {
        Self { expected: *d, hasher: Hasher::for_digest(d) }
    }

    /// Takes the next bytes.
    pub fn update(&mut self, b: &[u8]) {
        self.hasher.update(b);
    }

    /// Whether all the bytes hash to the digest.
    pub fn finish(self) -> Result<()> {
        match self.hasher.finish() {
            actual if actual == self.expected.to_string() => Ok(()),
            actual => Err(ClientError::DigestMismatch { expected: self.expected.to_string(), actual }),
        }
    }
}

/// A whole blob in memory, verified against its digest.
pub async fn get_bytes(reader: &Reader, d: &AnyDigest) -> Result<bytes::Bytes> {
    let (len, mut body) = reader.download(d).await?;
    let mut v = Verifier::new(d);
    let mut data = Vec::with_capacity(len.unwrap_or(0).min(1 << 30) as usize);
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        v.update(&chunk);
        data.extend_from_slice(&chunk);
    }
    v.finish()?;
    Ok(data.into())
}

/// The temporary name a download is written to before it is verified.
fn partial_name(output: &Path) -> PathBuf {
    let name = output.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    output.with_file_name(format!(".{name}.spillway-partial"))
}

/// Downloads while hashing; with `output`, the file appears only once verified.
pub async fn get(reader: &Reader, d: &AnyDigest, output: Option<&Path>) -> Result<()> {
    let (len, mut body) = reader.download(d).await?;
    let bar = progress(len);
    let mut hasher = Verifier::new(d);
    let tmp = output.map(partial_name);
    let mut sink: Box<dyn Write> = match (&tmp, output) {
        (Some(t), Some(o)) => {
            Box::new(std::io::BufWriter::new(std::fs::File::create(t).map_err(|e| ClientError::file(o, e))?))
        }
        _ => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let written = async {
        while let Some(chunk) = body.next().await {
            let chunk = chunk?;
            hasher.update(&chunk);
            sink.write_all(&chunk)?;
            bar.inc(chunk.len() as u64);
        }
        sink.flush()?;
        Ok::<_, ClientError>(())
    }
    .await;
    bar.finish_and_clear();
    drop(sink);
    let verified = written.and_then(|()| hasher.finish());
    match (verified, tmp, output) {
        (Ok(()), Some(t), Some(o)) => std::fs::rename(&t, o).map_err(|e| ClientError::file(o, e)),
        (Err(e), Some(t), _) => {
            let _ = std::fs::remove_file(t);
            Err(e)
        }
        (result, _, _) => result,
    }
}
