//! Outputs whose stored bytes failed their hash or are gone (api.md v1.3, Integrity), as this
//! process knows them: every read of one answers `500 corrupt`, never its bytes.
//!
//! What can be checked as it is read is: a compacted blob's chunks against their names as they
//! are decompressed (`chunks/`), and a raw blob's whole download against its digest as it
//! streams. A capped page or a grep of a raw blob reads a span, which has no hash of its own;
//! the scrub (`jobs/scrub.rs`) reads raw blobs whole and marks what fails, and from then on
//! their pages are refused too. The marks live in the database (`damaged_blobs`), so that
//! every replica refuses them: this process reads them whole every few seconds
//! ([`Blobs::refresh_damage`]) and adds its own at once.

use std::collections::HashSet;
use std::time::Duration;

use spillway_api::Digest;

use crate::blobs::Blobs;

/// How often the marks other processes made are read.
pub const REFRESH: Duration = Duration::from_secs(5);

impl Blobs {
    /// Marks `d` damaged, here and in the database, and forgets what this process kept of it.
    pub async fn mark_damaged(&self, d: &Digest, kind: &'static str) {
        tracing::error!(digest = %d, kind, "stored bytes fail their hash or are gone; marked");
        self.damage.set(*d, true);
        self.forget_bytes(d);
        metrics::counter!("spillway_corrupt_found_total").increment(1);
        if let Err(e) = self.db.mark_damaged(d, kind, self.now()).await {
            tracing::error!(digest = %d, cause = %e, "could not record damage");
        }
    }

    /// Removes `d`'s mark (stored again, or found good).
    pub async fn clear_damaged(&self, d: &Digest) -> Result<(), crate::db::DbError> {
        self.db.clear_damaged(d).await?;
        self.damage.set(*d, false);
        self.forget_bytes(d);
        Ok(())
    }

    /// Forgets the row, chunk list and text this process kept of `d`.
    pub(crate) fn forget_bytes(&self, d: &Digest) {
        self.rows.forget(d);
        self.chunks.forget(d);
        if let Some(text) = &self.text {
            text.forget(d);
        }
        self.secrets.forget(d);
    }

    /// Reads the marks every process made (a handful of rows, or none).
    pub async fn refresh_damage(&self) -> Result<(), crate::db::DbError> {
        let now: HashSet<Digest> = self.db.damaged_blobs().await?.into_iter().collect();
        for d in self.damage.replace(now) {
            self.forget_bytes(&d);
        }
        Ok(())
    }

    /// A raw blob's bytes were not found under a live row: marked `missing` unless, looked at
    /// again a moment later, they are there or the row is gone (an upload publishing again
    /// what a racing deletion removed; a deletion).
    pub fn suspect_missing(&self, d: &Digest) {
        let (blobs, d) = (self.clone(), *d);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let row = blobs.db.blob_row(&d).await;
            if let Ok(Some(row)) = row {
                if !row.chunked
                    && row.inline_data.is_none()
                    && matches!(blobs.store.exists(&d).await, Ok(false))
                    && blobs.store.lists_blobs().await
                {
                    blobs.mark_damaged(&d, "missing").await;
                }
            }
        });
    }
}

/// Reads the marks every [`REFRESH`] until `cancel`.
pub async fn refresh_damage(blobs: Blobs, cancel: tokio_util::sync::CancellationToken) {
    loop {
        if let Err(e) = blobs.refresh_damage().await {
            tracing::warn!(cause = %e, "could not read the damage marks");
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(REFRESH) => {}
        }
    }
}
