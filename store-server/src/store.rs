//! The service layer's first piece: what more than one handler needs to reach a blob —
//! visibility in a namespace (with its caches) and a stored blob as a paging source. Handlers
//! call it; they never import each other.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use spillway_api::paging::lines::{Checkpoint, LineIndex};
use spillway_api::paging::Source;
use spillway_api::{AnyDigest, Digest, Namespace};

use crate::blobs::BlobError;
use crate::blobs::BlobStore;
use crate::db::BlobRow;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::text::{EscapedPage, TextBlob};

/// Resolves a digest in the caller's namespace, or `404` exactly as if it did not exist.
pub async fn visible(state: &AppState, ns: &Namespace, d: &AnyDigest) -> ApiResult<Arc<BlobRow>> {
    let now = state.now();
    let not_found = || ApiError::NotFound(format!("blob {d}"));
    let digest = match d {
        AnyDigest::Blake3(b) => b,
        AnyDigest::Sha256(s) => {
            let row = state.db.visible_blob_by_sha256(ns, s, now).await?;
            return row.map(Arc::new).ok_or_else(not_found);
        }
    };
    if !state.visibility.visible(ns, digest, now) {
        let until = state.db.visible_until(ns, digest, now).await?.ok_or_else(not_found)?;
        state.visibility.remember(ns, digest, until);
    }
    if let Some(row) = state.blob_rows.get(digest) {
        return Ok(row);
    }
    let row = Arc::new(state.db.blob_row(digest).await?.ok_or_else(not_found)?);
    state.blob_rows.put(row.clone());
    Ok(row)
}

/// A page of the capped read API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PageAsk {
    /// `limit` bytes from `offset` (capped).
    Bytes { offset: u64, limit: u64 },
    /// `lines` whole lines from 1-based `line` (capped).
    Lines { line: u64, lines: u64 },
}

/// A page of a stored blob from its escaped text (`text.rs`), or `None` when that page is to
/// be cut the usual way (a small inline blob, no text cache, a page that is not plain text).
pub(crate) async fn escaped_page(state: &AppState, row: &BlobRow, ask: PageAsk) -> ApiResult<Option<EscapedPage>> {
    let (Some(text), None) = (&state.text, &row.inline_data) else {
        return Ok(None);
    };
    let blob = TextBlob { digest: &row.digest, size: row.size, lines: row.lines, line_index: &row.line_index };
    let fetch = |r: std::ops::Range<u64>| state.blobs.get_range(&row.digest, row.size, r);
    Ok(match ask {
        PageAsk::Bytes { offset, limit } => text.byte_page(blob, offset, limit, fetch).await?,
        PageAsk::Lines { line, lines } => text.line_page(blob, line, lines, fetch).await?,
    })
}

/// A stored blob as a read source.
pub struct BlobSource {
    pub blobs: BlobStore,
    pub digest: Digest,
    pub size: u64,
    pub lines: u64,
    pub index: LineIndex,
    pub inline: Option<Bytes>,
}

impl BlobSource {
    pub fn new(state: &AppState, row: &BlobRow) -> ApiResult<Self> {
        Ok(Self {
            blobs: state.blobs.clone(),
            digest: row.digest,
            size: row.size,
            lines: row.lines,
            index: LineIndex::decode(&row.line_index),
            inline: row.inline_data.clone().map(Bytes::from),
        })
    }
}

#[async_trait]
impl Source for BlobSource {
    type Error = BlobError;
    fn size(&self) -> u64 {
        self.size
    }
    fn total_lines(&self) -> u64 {
        self.lines
    }
    fn digest(&self) -> Option<String> {
        Some(self.digest.to_string())
    }
    async fn checkpoint_for_offset(&self, offset: u64) -> Result<Checkpoint, BlobError> {
        Ok(self.index.for_offset(offset))
    }
    async fn checkpoint_for_line(&self, line: u64) -> Result<Checkpoint, BlobError> {
        Ok(self.index.for_line(line))
    }
    async fn read(&self, start: u64, end: u64) -> Result<Bytes, BlobError> {
        if let Some(data) = &self.inline {
            return Ok(data.slice(start as usize..end as usize));
        }
        self.blobs.get_range(&self.digest, self.size, start..end).await
    }
}
