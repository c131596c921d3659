//! `SecretCache`: the secrets of blobs' blocks as the detector finds them, kept so that a
//! redacted capped read scans a block once and then only cuts its page and puts the marks in.

use std::future::Future;
use std::sync::Arc;

use spillway_api::redact::Span;
use spillway_api::Digest;

/// Weighs a block's secrets by their number (one for a block with none).
#[derive(Clone, Copy, Debug)]
struct BySpans;

impl quick_cache::Weighter<(Digest, u64), Arc<[Span]>> for BySpans {
    fn weight(&self, _: &(Digest, u64), spans: &Arc<[Span]>) -> u64 {
        1 + spans.len() as u64
    }
}

/// The secrets of blobs' blocks (`spillway_api::paging::block_secrets`, by digest and block of
/// `SECRET_BLOCK` bytes), as the server's detector finds them: a redacted capped read scans a
/// block once, then only cuts its page and puts the marks in. A digest names its content and
/// the detector is fixed at start-up, so an entry never goes stale.
pub(crate) struct SecretCache {
    blocks: quick_cache::sync::Cache<(Digest, u64), Arc<[Span]>, BySpans>,
}

impl std::fmt::Debug for SecretCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretCache({} blocks)", self.blocks.len())
    }
}

impl SecretCache {
    /// Blocks kept: 65,536 of 256 KiB are the secrets of 16 GiB of blobs, in a few MiB.
    const BLOCKS: usize = 1 << 16;

    /// Forgets what was found in `d`'s blocks (its stored bytes were damaged, or stored again).
    pub(crate) fn forget(&self, d: &Digest) {
        self.blocks.retain(|(k, _), _| k != d);
    }

    pub(crate) fn new() -> Self {
        Self { blocks: quick_cache::sync::Cache::with_weighter(Self::BLOCKS, 2 * Self::BLOCKS as u64, BySpans) }
    }

    /// The secrets of block `block` of blob `d`, found with `find` once however many readers
    /// ask at the same time.
    pub(crate) async fn get<E>(
        &self,
        d: &Digest,
        block: u64,
        find: impl Future<Output = Result<Arc<[Span]>, E>>,
    ) -> Result<Arc<[Span]>, E> {
        self.blocks.get_or_insert_async(&(*d, block), find).await
    }
}
