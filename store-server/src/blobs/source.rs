//! The service layer's first piece: what more than one handler needs to reach a blob —
//! visibility in a namespace (with its caches) and a stored blob as a paging source. Handlers
//! call it; they never import each other.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use spillway_api::paging::lines::{Checkpoint, LineIndex};
use spillway_api::paging::Source;
use spillway_api::{AnyDigest, Digest, Namespace};

use crate::blobs::text::{EscapedPage, TextBlob};
use crate::blobs::Blobs;
use crate::db::BlobRow;
use crate::error::{ApiError, ApiResult};
use crate::jobs::heavy::Pace;
use crate::storage::BlobError;

/// Resolves a digest in the caller's namespace, or `404` exactly as if it did not exist.
pub async fn visible(blobs: &Blobs, ns: &Namespace, d: &AnyDigest) -> ApiResult<Arc<BlobRow>> {
    let now = blobs.now();
    let not_found = || ApiError::NotFound(format!("blob {d}"));
    let digest = match d {
        AnyDigest::Blake3(b) => b,
        AnyDigest::Sha256(s) => {
            let row = blobs.db.visible_blob_by_sha256(ns, s, now).await?;
            return row.map(Arc::new).ok_or_else(not_found);
        }
    };
    if !blobs.visibility.visible(ns, digest, now) {
        let until = blobs.db.visible_until(ns, digest, now).await?.ok_or_else(not_found)?;
        blobs.visibility.remember(ns, digest, until);
    }
    if let Some(row) = blobs.rows.get(digest) {
        return Ok(row);
    }
    let row = Arc::new(blobs.db.blob_row(digest).await?.ok_or_else(not_found)?);
    blobs.rows.put(row.clone());
    Ok(row)
}

/// What [`visible`] answers from this process's caches alone; `None` when it would ask the
/// database (or the blob is not visible).
pub(crate) fn visible_cached(blobs: &Blobs, ns: &Namespace, d: &AnyDigest) -> Option<Arc<BlobRow>> {
    let AnyDigest::Blake3(digest) = d else { return None };
    if !blobs.visibility.visible(ns, digest, blobs.now()) {
        return None;
    }
    blobs.rows.get(digest)
}

/// A page of the capped read API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PageAsk {
    /// `limit` bytes from `offset` (capped).
    Bytes { offset: u64, limit: u64 },
    /// `lines` whole lines from 1-based `line` (capped).
    Lines { line: u64, lines: u64 },
}

/// A page of a stored blob from its escaped text (`blobs/text/`), or `None` when that page is to
/// be cut the usual way (a small inline blob, no text cache, a page that is not plain text).
pub(crate) async fn escaped_page(blobs: &Blobs, row: &Arc<BlobRow>, ask: PageAsk) -> ApiResult<Option<EscapedPage>> {
    blobs.damage.check(&row.digest)?;
    let (Some(text), None) = (&blobs.text, &row.inline_data) else {
        return Ok(None);
    };
    let blob = TextBlob { digest: &row.digest, size: row.size, lines: row.lines, line_index: &row.line_index };
    let fetch = |r: Range<u64>| blob_range(blobs, row, r);
    Ok(match ask {
        PageAsk::Bytes { offset, limit } => text.byte_page(blob, offset, limit, fetch).await?,
        PageAsk::Lines { line, lines } => text.line_page(blob, line, lines, fetch).await?,
    })
}

/// The redacted form of plain page `page` (from [`escaped_page`]), from the secrets kept by
/// block (`Source::kept_secrets`): with no secret, the plain page with `redactions: 0`; with
/// some, the escaped text with marks in their place (`blobs/text/`), cut as a line page when
/// `whole_lines`. `None` when the page is to be cut the usual way.
pub(crate) async fn redacted_escaped_page(
    blobs: &Blobs,
    row: &Arc<BlobRow>,
    mut page: EscapedPage,
    whole_lines: bool,
) -> ApiResult<Option<EscapedPage>> {
    let src = BlobSource::new(blobs, row)?;
    let (lo, hi) = (page.page.offset, page.page.offset + page.page.length);
    let spans = match spillway_api::paging::kept_spans(&src, &blobs.redactor, lo, hi).await? {
        Some(spans) => spans,
        None => return Ok(None),
    };
    if spans.is_empty() {
        page.page.redactions = Some(0);
        return Ok(Some(page));
    }
    let Some(text) = &blobs.text else {
        return Ok(None);
    };
    let blob = TextBlob { digest: &row.digest, size: row.size, lines: row.lines, line_index: &row.line_index };
    let fetch = |r: Range<u64>| blob_range(blobs, row, r);
    Ok(text.marked_page(blob, &page.page, &spans, whole_lines, fetch).await?)
}

/// Bytes `range` of a stored blob, wherever they are now: in its row (inline), in its raw
/// copy, or in its chunks once compacted. A row read before a compaction (here or on another
/// replica), or before a deletion and a new upload of the same content, may name a layout
/// that is gone: the bytes are then read as the row says now.
///
/// Bytes that fail their check are never handed out: a marked blob is refused before it is
/// read, and a chunk that fails marks its blob (`Err(Corrupt)`); bytes missing under a live
/// row are `Err(Corrupt)` too, and marked once they are still missing a moment later.
pub async fn blob_range(blobs: &Blobs, row: &BlobRow, range: Range<u64>) -> Result<Bytes, BlobError> {
    blobs.damage.check(&row.digest)?;
    if let Some(data) = &row.inline_data {
        return Ok(Bytes::copy_from_slice(&data[range.start as usize..range.end as usize]));
    }
    let got = match range_as(blobs, row, range.clone()).await {
        Err(BlobError::NotFound) => match moved(blobs, row).await? {
            Layout::Moved(now) => range_as(blobs, &now, range).await,
            Layout::Same => missing(blobs, row).await,
            Layout::Gone => Err(BlobError::NotFound),
        },
        other => other,
    };
    if let Err(BlobError::Corrupt(d)) = &got {
        if !blobs.damage.contains(d) && row.chunked {
            blobs.mark_damaged(d, "corrupt").await;
        }
    }
    got
}

async fn range_as(blobs: &Blobs, row: &BlobRow, range: Range<u64>) -> Result<Bytes, BlobError> {
    if row.chunked {
        blobs.chunks.read(&blobs.db, &blobs.store, &row.digest, range).await
    } else {
        blobs.store.get_range(&row.digest, row.size, range).await
    }
}

/// Bytes `range` of a stored blob as a stream (a full download), wherever they are.
pub async fn blob_stream(
    blobs: &Blobs,
    row: &BlobRow,
    range: Range<u64>,
) -> Result<BoxStream<'static, Result<Bytes, BlobError>>, BlobError> {
    blobs.damage.check(&row.digest)?;
    if let Some(data) = &row.inline_data {
        let data = Bytes::copy_from_slice(&data[range.start as usize..range.end as usize]);
        return Ok(futures::stream::once(async move { Ok(data) }).boxed());
    }
    let stream = match stream_as(blobs, row, range.clone()).await {
        Err(BlobError::NotFound) => match moved(blobs, row).await? {
            Layout::Moved(now) => stream_as(blobs, &now, range.clone()).await,
            Layout::Same => missing(blobs, row).await,
            Layout::Gone => Err(BlobError::NotFound),
        },
        other => other,
    }?;
    Ok(checked(blobs.clone(), row.digest, range.start == 0 && range.end == row.size, stream))
}

/// A download as it streams. When it is the whole blob, it is hashed and its last piece held
/// back until the hash is known: bytes that are not the blob's end the body with an error
/// instead of that piece, so the connection closes before the body completes and no client
/// takes it for whole. Whatever the range, a chunk that fails its check ends it too. Either
/// marks the blob.
fn checked(
    blobs: Blobs,
    digest: Digest,
    whole: bool,
    stream: BoxStream<'static, Result<Bytes, BlobError>>,
) -> BoxStream<'static, Result<Bytes, BlobError>> {
    struct Check {
        inner: BoxStream<'static, Result<Bytes, BlobError>>,
        hasher: Option<blake3::Hasher>,
        held: Option<Bytes>,
        done: bool,
    }
    let start = Check { inner: stream, hasher: whole.then(blake3::Hasher::new), held: None, done: false };
    futures::stream::unfold(start, move |mut st| {
        let blobs = blobs.clone();
        async move {
            if st.done {
                return None;
            }
            loop {
                match st.inner.next().await {
                    Some(Ok(bytes)) => {
                        let Some(h) = st.hasher.as_mut() else { return Some((Ok(bytes), st)) };
                        h.update(&bytes);
                        if let Some(prev) = st.held.replace(bytes) {
                            return Some((Ok(prev), st));
                        }
                    }
                    Some(Err(BlobError::Corrupt(_))) => break,
                    Some(Err(e)) => {
                        st.done = true;
                        return Some((Err(e), st));
                    }
                    None => {
                        st.done = true;
                        let whole_ok =
                            st.hasher.take().is_none_or(|h| Digest::from_bytes(*h.finalize().as_bytes()) == digest);
                        if whole_ok {
                            return st.held.take().map(|last| (Ok(last), st));
                        }
                        break;
                    }
                }
            }
            st.done = true;
            if !blobs.damage.contains(&digest) {
                blobs.mark_damaged(&digest, "corrupt").await;
            }
            Some((Err(BlobError::Corrupt(digest)), st))
        }
    })
    .boxed()
}

/// Bytes not found under a live row whose layout has not moved: gone, in a store that answers;
/// else the store is down.
async fn missing<T>(blobs: &Blobs, row: &BlobRow) -> Result<T, BlobError> {
    if !blobs.store.lists_blobs().await {
        return Err(BlobError::storage("the blob store does not answer a listing"));
    }
    blobs.suspect_missing(&row.digest);
    Err(BlobError::Corrupt(row.digest))
}

async fn stream_as(
    blobs: &Blobs,
    row: &BlobRow,
    range: Range<u64>,
) -> Result<BoxStream<'static, Result<Bytes, BlobError>>, BlobError> {
    if row.chunked {
        // Its chunk list read afresh: a download must not begin from a list that is gone.
        blobs.chunks.forget(&row.digest);
        blobs.chunks.stream(&blobs.db, &blobs.store, &row.digest, range).await
    } else {
        blobs.store.get_stream(&row.digest, range).await
    }
}

/// Where a blob's bytes are by the database's word now, after they were not where `row`
/// said.
enum Layout {
    /// In another layout (compacted meanwhile, or stored anew): the cached row is renewed.
    Moved(Arc<BlobRow>),
    /// Where `row` said: the row is there and its bytes are not — damage, not a race (a
    /// deletion removes bytes and row in one transaction; an upload publishes before its row).
    Same,
    /// The blob was deleted meanwhile.
    Gone,
}

async fn moved(blobs: &Blobs, row: &BlobRow) -> Result<Layout, BlobError> {
    let fresh = blobs.db.blob_row(&row.digest).await.map_err(|e| BlobError::Storage(e.into()))?;
    Ok(match fresh {
        Some(now) if now.chunked != row.chunked => {
            let now = Arc::new(now);
            blobs.rows.put(now.clone());
            blobs.chunks.forget(&row.digest);
            Layout::Moved(now)
        }
        Some(_) => Layout::Same,
        None => Layout::Gone,
    })
}

/// A stored blob as a read source.
pub struct BlobSource {
    blobs: Blobs,
    row: Arc<BlobRow>,
    index: LineIndex,
    /// Whether each read starts fetching the bytes after it (see [`BlobSource::scanning`]).
    ahead: bool,
    /// Where a scan that gives way to requests stands (see [`BlobSource::giving_way`]).
    pace: Option<std::sync::Mutex<Pace>>,
}

impl BlobSource {
    /// The blob of `row`, for the paging code.
    pub fn new(blobs: &Blobs, row: &Arc<BlobRow>) -> ApiResult<Self> {
        blobs.damage.check(&row.digest)?;
        let index = LineIndex::decode(&row.line_index);
        Ok(Self { blobs: blobs.clone(), row: row.clone(), index, ahead: false, pace: None })
    }

    /// The same source for a scan that gives way to requests between its windows, as a
    /// compaction does (`Heavy::give_way`), its work counted from `pace`: a search across
    /// outputs, which may scan for as long as its budget lets it, and more than one at a time.
    pub fn giving_way(mut self, pace: Pace) -> Self {
        self.pace = Some(std::sync::Mutex::new(pace));
        self
    }

    /// The same source for a scan front to back (grep, search): each read of `n` bytes starts
    /// fetching the `n` after it from the blob's backend (`BlobStore::read_ahead`), so that the
    /// disk or S3 works while the scan reads these. Not a compacted blob: there the next bytes
    /// cost a decompression, not a wait, and decompressing them ahead on a 2-core machine made
    /// a search 1.4× slower (`docs/benchmarks.md`, "Reading ahead").
    pub fn scanning(mut self) -> Self {
        self.ahead = self.row.inline_data.is_none() && !self.row.chunked;
        self
    }

    /// Starts fetching bytes `range` (cut at the blob's end), which a scan will read next.
    pub fn fetch_ahead(&self, range: Range<u64>) {
        let next = range.start..self.row.size.min(range.end);
        if !self.ahead || next.is_empty() {
            return;
        }
        self.blobs.store.read_ahead(&self.row.digest, self.row.size, next);
    }
}

#[async_trait]
impl Source for BlobSource {
    type Error = BlobError;
    fn size(&self) -> u64 {
        self.row.size
    }
    fn total_lines(&self) -> u64 {
        self.row.lines
    }
    fn digest(&self) -> Option<String> {
        Some(self.row.digest.to_string())
    }
    async fn checkpoint_for_offset(&self, offset: u64) -> Result<Checkpoint, BlobError> {
        Ok(self.index.for_offset(offset))
    }
    async fn checkpoint_for_line(&self, line: u64) -> Result<Checkpoint, BlobError> {
        Ok(self.index.for_line(line))
    }
    async fn read(&self, start: u64, end: u64) -> Result<Bytes, BlobError> {
        let bytes = blob_range(&self.blobs, &self.row, start..end).await?;
        self.fetch_ahead(end..end + (end - start));
        Ok(bytes)
    }
    async fn kept_secrets(
        &self,
        detector: &spillway_api::redact::Detector,
        block: u64,
    ) -> Option<spillway_api::paging::PageResult<Arc<[spillway_api::redact::Span]>, BlobError>> {
        // Kept for the server's own detector only: what it finds in a block never changes.
        if !std::ptr::eq(detector, &*self.blobs.redactor) {
            return None;
        }
        let find = spillway_api::paging::block_secrets(self, detector, block);
        Some(self.blobs.secrets.get(&self.row.digest, block, find).await)
    }
    async fn between_windows(&self) {
        let pace = self.pace.as_ref();
        let pause = pace.and_then(|p| self.blobs.heavy.pause_for(&mut p.lock().unwrap_or_else(|e| e.into_inner())));
        crate::jobs::heavy::rest(pause).await;
    }
}
