//! Saved outputs as input (`exec --stdin REF`, MCP `run` with `stdin`): a command reads the
//! bytes of a stored output — a blob, checked against its digest as it streams, or a stream as
//! written so far — without them passing through the model, or through this process's memory
//! whole: a chunk at a time, whatever the size.

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::conn::parse_digest;
use crate::error::{ClientError, Result};
use crate::reader::Reader;
use crate::transfer::Verifier;

/// A saved output opened for reading: where its bytes come from, and the check they must pass.
pub struct Input {
    body: BoxStream<'static, Result<Bytes>>,
    check: Option<Verifier>,
    /// What it was opened from.
    reference: String,
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Input").field("reference", &self.reference).finish_non_exhaustive()
    }
}

/// How a feed ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fed {
    /// Every byte was written and passed its check.
    All,
    /// The command closed its stdin first (`head`): the rest was not sent, nor needed.
    StoppedEarly,
}

impl Input {
    /// Opens `reference` — a digest (`blake3:…`, `sha256:…`, 64 hex digits) or a stream id —
    /// through `reader`. The refusals come now, before any command starts: a malformed
    /// reference is `invalid_digest`; one this token cannot read is the `not_found` a read
    /// gives. A stream is read as written so far (its blob, checked, once sealed).
    pub async fn open(reader: &Reader, reference: &str) -> Result<Self> {
        let reference = reference.trim().to_owned();
        if spillway_api::StreamId::new(&reference).is_ok() {
            let Reader::Store(store) = reader else {
                return Err(ClientError::Other(format!(
                    "{reference} is a stream id, and streams are in the store: --local reads digests only \
                     (invalid_argument)"
                )));
            };
            let info = store.stream_info(&reference).await?;
            if let Some(d) = info.digest {
                return Self::blob(reader, &d, reference).await;
            }
            return Ok(Self {
                body: stream_so_far(store.clone(), reference.clone(), info.size),
                check: None,
                reference,
            });
        }
        Self::blob(reader, &reference.clone(), reference).await
    }

    async fn blob(reader: &Reader, digest: &str, reference: String) -> Result<Self> {
        let d = parse_digest(digest)?;
        let (_, body) = reader.download(&d).await?;
        Ok(Self { body, check: Some(Verifier::new(&d)), reference })
    }

    /// Writes every byte to `sink` as it arrives. The last check comes before the caller
    /// closes `sink`: a command fed bytes that fail their digest never sees the end of its
    /// input (the caller stops it), so it cannot answer as if they were the output. A sink
    /// that closes first (the command stopped reading) ends the feed cleanly.
    pub async fn feed<W: AsyncWrite + Unpin>(mut self, sink: &mut W) -> Result<Fed> {
        while let Some(chunk) = self.body.next().await {
            let chunk = chunk?;
            if let Some(v) = &mut self.check {
                v.update(&chunk);
            }
            match sink.write_all(&chunk).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(Fed::StoppedEarly),
                Err(e) => return Err(e.into()),
            }
        }
        match sink.flush().await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(Fed::StoppedEarly),
            Err(e) => return Err(e.into()),
        }
        if let Some(v) = self.check {
            v.finish()?;
        }
        Ok(Fed::All)
    }
}

/// A stream's bytes from 0 to `end` (its size when it was opened), a window at a time.
fn stream_so_far(store: crate::store::StoreClient, id: String, end: u64) -> BoxStream<'static, Result<Bytes>> {
    futures::stream::try_unfold(0u64, move |offset| {
        let (store, id) = (store.clone(), id.clone());
        async move {
            if offset >= end {
                return Ok(None);
            }
            let (data, _) = store.stream_bytes(&id, offset, Some((end - offset).min(4 << 20))).await?;
            if data.is_empty() {
                return Err(ClientError::Other(format!("stream {id} answered no bytes at {offset} of {end}")));
            }
            let next = offset + data.len() as u64;
            Ok(Some((data, next)))
        }
    })
    .boxed()
}
