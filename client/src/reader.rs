//! One reader of stored outputs behind the CLI's read, grep and get (and the MCP tools): the
//! store, or a `--local` directory of spills, chosen once. Both answer with the server's
//! shapes and caps.

use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use spillway_api::redact::Detector;
use spillway_api::{AnyDigest, Digest, ErrorCode, GrepResponse, ReadPage};

use crate::error::{ClientError, Result};
use crate::local::{self, LocalSource};
use crate::spill::LocalDir;
use crate::store::{GrepRequest, ReadRequest, StoreClient};

/// Where reads go.
#[derive(Debug, Clone)]
pub enum Reader {
    /// The shared store (which redacts when the client asks it to: [`StoreClient::redacting`]).
    Store(StoreClient),
    /// A directory of spills named by BLAKE3, and the detector of its redacted reads.
    Local(LocalDir, Option<Arc<Detector>>),
}

/// A download: its length when known, and its bytes.
pub type Download = (Option<u64>, BoxStream<'static, Result<Bytes>>);

fn blake3_only(d: &AnyDigest) -> Result<&Digest> {
    match d {
        AnyDigest::Blake3(b) => Ok(b),
        AnyDigest::Sha256(_) => Err(ClientError::Other(
            "local spills are named by BLAKE3: use the blake3: digest (invalid_argument)".into(),
        )),
    }
}

impl Reader {
    /// The same reader, whose pages and greps show secrets as marks when `detector` is given
    /// (the store is asked with `redact=true`; a local directory is redacted here, with the
    /// same detector as the server's).
    pub fn redacting(self, detector: Option<Arc<Detector>>) -> Self {
        match self {
            Self::Store(s) => Self::Store(s.redacting(detector.is_some())),
            Self::Local(dir, _) => Self::Local(dir, detector),
        }
    }

    /// The local directory, when reads go there.
    pub fn local_dir(&self) -> Option<&LocalDir> {
        match self {
            Self::Local(dir, _) => Some(dir),
            Self::Store(_) => None,
        }
    }

    /// One capped page.
    pub async fn read(&self, d: &AnyDigest, req: ReadRequest) -> Result<ReadPage> {
        match self {
            Self::Store(s) => s.read(d, req).await,
            Self::Local(dir, redact) => {
                local::read(&LocalSource::open(dir, blake3_only(d)?).await?, req, redact.as_deref()).await
            }
        }
    }

    /// Matching lines, capped and resumable.
    pub async fn grep(&self, d: &AnyDigest, g: &GrepRequest) -> Result<GrepResponse> {
        match self {
            Self::Store(s) => s.grep(d, g).await,
            Self::Local(dir, redact) => {
                local::grep(&LocalSource::open(dir, blake3_only(d)?).await?, g, redact.as_deref()).await
            }
        }
    }

    /// The whole blob as a stream of bytes, not yet verified.
    pub async fn download(&self, d: &AnyDigest) -> Result<Download> {
        match self {
            Self::Store(s) => {
                let resp = s.get(d).await?;
                Ok((resp.content_length(), resp.bytes_stream().map(|r| r.map_err(ClientError::from)).boxed()))
            }
            Self::Local(dir, _) => {
                let path = dir.path_of(blake3_only(d)?);
                let f = tokio::fs::File::open(&path).await.map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => ClientError::Api {
                        status: 404,
                        code: ErrorCode::NotFound,
                        message: format!("{d} not found in {}", dir.dir().display()),
                    },
                    _ => ClientError::file(&path, e),
                })?;
                let len = f.metadata().await.ok().map(|m| m.len());
                let body = tokio_util::io::ReaderStream::with_capacity(f, 256 * 1024)
                    .map(move |r| r.map_err(|e| ClientError::file(&path, e)));
                Ok((len, body.boxed()))
            }
        }
    }
}
