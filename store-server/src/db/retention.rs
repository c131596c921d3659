//! The SQL of retention: expire references, note blobs nobody references, claim them for
//! deletion, and delete them. Every step works in pages ordered by key, and PostgreSQL
//! replicas skip rows another replica has locked instead of colliding with it.
//!
//! # The invariant: bytes go only with a row nobody can reference any more
//!
//! **The bytes of content X are removed only inside a transaction that holds X's `blobs` row
//! (PostgreSQL: `SELECT … FOR UPDATE`; SQLite: the write transaction, which holds the whole
//! database), finds it `deleting`, and — in a statement issued after the lock was granted —
//! finds no reference to X. The row is deleted in that same transaction.**
//!
//! Every transaction that adds a reference to X first writes X's row: it inserts it, clears
//! its grace (`live`), or takes it back (`deleting` → `live`) — see `Db::add_ref` and
//! `Db::add_ref_if_live`. (The SQLite writer's native path reads the row instead when it is
//! `live` and out of grace, and leaves it: its write transaction holds the whole database
//! from before that read to its commit, which serializes it with a deleter just the same.)
//! So it and a deleter serialize on the row:
//! - the upload commits first: the deleter, reading after its lock, sees the reference (or
//!   the row `live`) and leaves the bytes;
//! - the deleter commits first: the row is gone when the upload's statements run (PostgreSQL
//!   re-reads a row it waited for; SQLite ran the deleter's transaction whole before), so the
//!   upload inserts a new row — after publishing its own bytes, and it looks for them once its
//!   reference exists and publishes them again from its staged copy if the deleter took them.
//!   Bytes an upload cannot publish twice (a direct multipart upload to the content key) are
//!   completed inside its transaction, after the row is held, so no deleter runs between.
//!
//! This holds under PostgreSQL's default READ COMMITTED: a statement sees what committed
//! before it began, and a statement that waits for a row lock re-checks that row's new
//! version — but reads other tables (`refs`) as of its start. Hence the shapes here:
//! - `delete_claimed` locks the row in one statement and counts references in the next;
//! - `mark_unreferenced` locks its candidates (skipping rows an upload holds) and decides in a
//!   second statement, so a reference committed while it waited is seen and the grace stays
//!   exact (a single `UPDATE … WHERE NOT EXISTS (refs …)` would mark a just-referenced blob);
//!   on SQLite it walks a snapshot and decides in the write transaction, whose `UPDATE … WHERE
//!   NOT EXISTS (refs …)` sees every committed reference (nothing commits beside it);
//! - `claim_for_deletion` may run on a stale view at worst: a wrong claim deletes nothing
//!   (the deletion re-checks) and an upload takes the row back.
//!
//! Uploads never wait for a deletion beyond the row lock of one byte deletion: a claim
//! (`deleting`) is only an intention, which any upload of the same content overrides. A
//! deleter that crashes leaves its row `deleting` (and maybe no bytes): a pass past the
//! deletion lease finishes it, or an upload takes it back and publishes its bytes.
//! (What no lock can fence: a deleter whose database connection is cut while its storage
//! request is still in flight. Its transaction is gone, so the row is free, while the delete
//! may still land; the window is one storage request.)

use spillway_api::Digest;
use sqlx::{AnyConnection, Row};

use super::error::{DbError, DbResult};
use super::pool::{Backend, Db};

/// Rows a retention statement takes at a time.
const PAGE: i64 = 500;
/// SQLite's walk of `mark_unreferenced`: live blobs out of grace after `$1`, in digest order,
/// each with whether no live reference (as of `$2`) points to it. The `+` keeps SQLite on the
/// key's order: by `blobs_unreferenced` it would sort every blob out of grace for each page.
const UNREFERENCED_WALK: &str = "SELECT b.digest, NOT EXISTS (SELECT 1 FROM refs r WHERE r.digest = b.digest \
                                 AND (r.pinned = 1 OR r.expires_at > $2)) AS unreferenced FROM blobs b \
                                 WHERE b.digest > $1 AND b.state = 'live' AND +b.unreferenced_since IS NULL \
                                 ORDER BY b.digest LIMIT $3";
/// Blobs whose grace ended by `$1`, after `$2`: through the partial index `blobs_in_grace`
/// (migration 0011), whose condition is this query's `unreferenced_since IS NOT NULL`.
const COLLECTABLE: &str = "SELECT digest, size FROM blobs WHERE state = 'live' AND unreferenced_since IS NOT NULL \
                           AND unreferenced_since <= $1 AND digest > $2 ORDER BY digest LIMIT $3";
/// Deletions begun by `$1`, after `$2`: through the partial index `blobs_deleting`.
const STALE_DELETIONS: &str = "SELECT digest, size FROM blobs WHERE state = 'deleting' AND deleting_since <= $1 \
                               AND digest > $2 ORDER BY digest LIMIT $3";

impl Db {
    fn skip_locked(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => " FOR UPDATE SKIP LOCKED",
            Backend::Sqlite => "",
        }
    }

    /// Locks the rows a query reads until the transaction ends (PostgreSQL; a SQLite write
    /// transaction holds the whole database).
    pub(super) fn for_update(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => " FOR UPDATE",
            Backend::Sqlite => "",
        }
    }

    /// Runs one statement binding `(i64, i64)` as a write; returns the rows it touched.
    async fn write_two(&self, sql: String, a: i64, b: i64) -> DbResult<u64> {
        self.write(move |c| {
            Box::pin(async move { Ok(sqlx::query(&sql).bind(a).bind(b).execute(c).await?.rows_affected()) })
        })
        .await
    }

    /// Deletes up to `limit` expired, unpinned references; returns how many.
    pub async fn expire_refs(&self, now: i64, limit: i64) -> DbResult<u64> {
        let sql = format!(
            "DELETE FROM refs WHERE id IN (SELECT id FROM refs WHERE pinned = 0 AND expires_at <= $1 \
             ORDER BY id LIMIT $2{})",
            self.skip_locked()
        );
        self.write_two(sql, now, limit).await
    }

    /// Counts expired, unpinned references (for a dry run).
    pub async fn count_expired_refs(&self, now: i64) -> DbResult<u64> {
        let n: i64 =
            sqlx::query_scalar("SELECT CAST(COUNT(*) AS BIGINT) FROM refs WHERE pinned = 0 AND expires_at <= $1")
                .bind(now)
                .fetch_one(&self.pool)
                .await?;
        Ok(n as u64)
    }

    /// Of these digests, those that have a row.
    pub async fn known_blobs(&self, digests: &[Digest]) -> DbResult<std::collections::HashSet<Digest>> {
        if digests.is_empty() {
            return Ok(Default::default());
        }
        let marks: Vec<String> = (1..=digests.len()).map(|i| format!("${i}")).collect();
        let sql = format!("SELECT digest FROM blobs WHERE digest IN ({})", marks.join(", "));
        let mut q = sqlx::query_scalar::<_, String>(&sql);
        for d in digests {
            q = q.bind(d.hex());
        }
        let found = q.fetch_all(&self.pool).await?;
        found.into_iter().map(|hex| Digest::from_hex(&hex).ok_or_else(|| DbError::corrupt("digest", hex))).collect()
    }

    /// Claims bytes that have no row (a crash between publication and the row) by writing a
    /// `deleting` row for them, so that an upload of the same content about to insert its row
    /// waits for the sweep and publishes again. False when a row appeared first.
    pub async fn claim_orphan(&self, digest: &Digest, now: i64) -> DbResult<bool> {
        let digest = digest.hex();
        self.write(move |c| {
            Box::pin(async move {
                let n = sqlx::query(
                    "INSERT INTO blobs (digest, sha256, size, lines, line_index, created_at, state, deleting_since) \
                     VALUES ($1, '', 0, 0, $2, $3, 'deleting', $3) ON CONFLICT (digest) DO NOTHING",
                )
                .bind(digest)
                .bind(Vec::<u8>::new())
                .bind(now)
                .execute(c)
                .await?
                .rows_affected();
                Ok(n == 1)
            })
        })
        .await
    }

    /// Starts the grace period of live blobs that no live reference points to: from the moment
    /// their last reference expired, or from `now` for those with no reference at all (their
    /// references went by `DELETE`, which starts the grace itself, or by a crash between
    /// steps). Returns how many it marked.
    ///
    /// PostgreSQL: two statements per page, in one transaction: the first locks the candidates
    /// (skipping rows an upload holds), the second, a new snapshot under READ COMMITTED, decides
    /// with every reference committed before the locks were granted in sight. A single `UPDATE
    /// … WHERE NOT EXISTS (refs …)` would not do: when it waits for a row an upload holds, it
    /// re-checks that row after the upload commits but still reads `refs` as of its start, and
    /// would mark a blob that has just been referenced.
    ///
    /// SQLite: see [`Db::mark_unreferenced_sqlite`].
    pub async fn mark_unreferenced(&self, now: i64) -> DbResult<u64> {
        if self.backend == Backend::Sqlite {
            return self.mark_unreferenced_sqlite(now).await;
        }
        let mut total = 0;
        let mut after = String::new();
        loop {
            let lock = format!(
                "SELECT digest FROM blobs b WHERE state = 'live' AND unreferenced_since IS NULL AND digest > $1 \
                 AND NOT EXISTS (SELECT 1 FROM refs r WHERE r.digest = b.digest AND (r.pinned = 1 OR r.expires_at > $2)) \
                 ORDER BY digest LIMIT $3{}",
                self.skip_locked()
            );
            let from = after.clone();
            let (marked, last, full) = self
                .write(move |c| {
                    Box::pin(async move {
                        let page: Vec<String> =
                            sqlx::query_scalar(&lock).bind(from).bind(now).bind(PAGE).fetch_all(&mut *c).await?;
                        let (last, full) = (page.last().cloned(), page.len() as i64 == PAGE);
                        Ok((mark_each(c, &page, now).await?, last, full))
                    })
                })
                .await?;
            total += marked;
            match last {
                Some(last) if full => after = last,
                _ => return Ok(total),
            }
        }
    }

    /// [`Db::mark_unreferenced`] on SQLite, whose one writer every upload needs: the walk over
    /// every live blob is a read, never held by the writer. A page of `PAGE` rows at a time, in
    /// digest order, each with whether a live reference points to it, is read from a snapshot
    /// on a pooled connection; only the rows found unreferenced go to a write transaction,
    /// whose `UPDATE` decides again. That transaction holds the whole database, so it sees
    /// every reference committed before it and no upload commits during it: the grace is
    /// exact whatever the snapshot missed. A stale snapshot can only leave out a blob that lost
    /// its last reference during the walk (the next pass marks it) or propose one that was
    /// just referenced (the `UPDATE` leaves it).
    ///
    /// (Found unreferenced in one statement instead, the walk held the writer for the whole
    /// table: 1.1–1.7 s without an upload answered, 200,000 blobs, `bench/run-retention-stall.sh`.)
    async fn mark_unreferenced_sqlite(&self, now: i64) -> DbResult<u64> {
        let mut total = 0;
        let mut after = String::new();
        loop {
            let page = sqlx::query(UNREFERENCED_WALK).bind(&after).bind(now).bind(PAGE).fetch_all(&self.pool).await?;
            let mut found = Vec::new();
            for row in &page {
                if row.try_get::<i64, _>("unreferenced")? != 0 {
                    found.push(row.try_get::<String, _>("digest")?);
                }
            }
            if !found.is_empty() {
                total += self.write(move |c| Box::pin(async move { mark_each(c, &found, now).await })).await?;
            }
            match page.last() {
                Some(last) if page.len() as i64 == PAGE => after = last.try_get("digest")?,
                _ => return Ok(total),
            }
        }
    }

    /// Digests after `after` (from the first when `None`) whose grace period ended by `cutoff`, in key order.
    pub async fn collectable(&self, cutoff: i64, after: Option<&Digest>, limit: i64) -> DbResult<Vec<(Digest, u64)>> {
        self.page_of_sizes(COLLECTABLE, cutoff, after, limit).await
    }

    /// Moves one blob from `live` to `deleting` if it is still unreferenced past `cutoff`.
    /// A concurrent upload that references it clears `unreferenced_since` in its own
    /// transaction, so exactly one of the two wins.
    pub async fn claim_for_deletion(&self, digest: &Digest, cutoff: i64, now: i64) -> DbResult<bool> {
        let digest = digest.hex();
        self.write(move |c| {
            Box::pin(async move {
                let n = sqlx::query(
                    "UPDATE blobs SET state = 'deleting', deleting_since = $1 WHERE digest = $2 AND state = 'live' \
                     AND unreferenced_since IS NOT NULL AND unreferenced_since <= $3 \
                     AND NOT EXISTS (SELECT 1 FROM refs r WHERE r.digest = blobs.digest)",
                )
                .bind(now)
                .bind(digest)
                .bind(cutoff)
                .execute(c)
                .await?
                .rows_affected();
                Ok(n == 1)
            })
        })
        .await
    }

    /// Deletions that a crashed pass left half-done before `stale_before`, after `after`.
    pub async fn stale_deletions(
        &self,
        stale_before: i64,
        after: Option<&Digest>,
        limit: i64,
    ) -> DbResult<Vec<(Digest, u64)>> {
        self.page_of_sizes(STALE_DELETIONS, stale_before, after, limit).await
    }

    /// Second phase of a deletion, in one transaction that holds the blob's row: if the row is
    /// still `deleting` and no reference points to the blob (read after the lock was granted),
    /// `remove` deletes the bytes and then the row goes. An upload that takes the content back
    /// waits for this row lock, so bytes are never removed under a row an upload has made
    /// live again. `Ok(Ok(Some(size)))`: deleted; `Ok(Ok(None))`: the row was gone, taken back
    /// or referenced, and nothing was deleted; `Ok(Err(e))`: removing the bytes failed, the row
    /// stays claimed for a later pass.
    pub async fn delete_claimed<E: Send + 'static>(
        &self,
        digest: &Digest,
        remove: Box<dyn FnOnce() -> futures::future::BoxFuture<'static, Result<(), E>> + Send>,
    ) -> DbResult<Result<Option<u64>, E>> {
        let lock = format!("SELECT state, size FROM blobs WHERE digest = $1{}", self.for_update());
        let digest = digest.hex();
        self.write(move |c| {
            Box::pin(async move {
                let row = sqlx::query(&lock).bind(&digest).fetch_optional(&mut *c).await?;
                let Some(row) = row else { return Ok(Ok(None)) };
                let (state, size): (String, i64) = (row.try_get("state")?, row.try_get("size")?);
                let referenced: i64 = sqlx::query_scalar("SELECT CAST(COUNT(*) AS BIGINT) FROM refs WHERE digest = $1")
                    .bind(&digest)
                    .fetch_one(&mut *c)
                    .await?;
                if state != "deleting" || referenced > 0 {
                    return Ok(Ok(None));
                }
                if let Err(e) = remove().await {
                    return Ok(Err(e));
                }
                // A compacted blob's chunk list goes with it; its packs go once no list needs them.
                sqlx::query("DELETE FROM blob_chunks WHERE blob = $1").bind(&digest).execute(&mut *c).await?;
                sqlx::query("DELETE FROM blobs WHERE digest = $1 AND state = 'deleting'")
                    .bind(&digest)
                    .execute(&mut *c)
                    .await?;
                Ok(Ok(Some(size as u64)))
            })
        })
        .await
    }

    /// Deletes up to `limit` streams past their TTL (their chunks go with them).
    pub async fn expire_streams(&self, now: i64, limit: i64, dry_run: bool) -> DbResult<u64> {
        if dry_run {
            let n: i64 = sqlx::query_scalar("SELECT CAST(COUNT(*) AS BIGINT) FROM streams WHERE expires_at <= $1")
                .bind(now)
                .fetch_one(&self.pool)
                .await?;
            return Ok(n as u64);
        }
        let sql = format!(
            "DELETE FROM streams WHERE id IN (SELECT id FROM streams WHERE expires_at <= $1 ORDER BY id LIMIT $2{})",
            self.skip_locked()
        );
        self.write(move |c| {
            Box::pin(async move {
                // Chunks first, whether or not foreign keys cascade.
                sqlx::query(
                    "DELETE FROM stream_chunks WHERE stream_id IN (SELECT id FROM streams WHERE expires_at <= $1)",
                )
                .bind(now)
                .execute(&mut *c)
                .await?;
                Ok(sqlx::query(&sql).bind(now).bind(limit).execute(&mut *c).await?.rows_affected())
            })
        })
        .await
    }

    /// Blobs that a dry run would delete: unreferenced now or by expiry, past the grace period.
    pub async fn count_collectable(&self, now: i64, cutoff: i64) -> DbResult<(u64, u64)> {
        let row = sqlx::query(
            "SELECT CAST(COUNT(*) AS BIGINT) AS n, CAST(COALESCE(SUM(size), 0) AS BIGINT) AS bytes FROM blobs b \
             WHERE b.state = 'live' AND COALESCE(b.unreferenced_since, $1) <= $2 \
             AND NOT EXISTS (SELECT 1 FROM refs r WHERE r.digest = b.digest AND (r.pinned = 1 OR r.expires_at > $1))",
        )
        .bind(now)
        .bind(cutoff)
        .fetch_one(&self.pool)
        .await?;
        Ok((row.try_get::<i64, _>("n")? as u64, row.try_get::<i64, _>("bytes")? as u64))
    }
}

/// Starts the grace of each blob in `digests` that is live, out of grace and has no live
/// reference, as read by this statement: from its last reference's expiry, or `now`.
async fn mark_each(c: &mut AnyConnection, digests: &[String], now: i64) -> DbResult<u64> {
    let mut marked = 0;
    for digest in digests {
        marked += sqlx::query(
            "UPDATE blobs SET unreferenced_since = COALESCE( \
                 (SELECT MAX(r.expires_at) FROM refs r WHERE r.digest = blobs.digest), $2) \
             WHERE digest = $1 AND state = 'live' AND unreferenced_since IS NULL \
             AND NOT EXISTS (SELECT 1 FROM refs r WHERE r.digest = blobs.digest \
                             AND (r.pinned = 1 OR r.expires_at > $2))",
        )
        .bind(digest)
        .bind(now)
        .execute(&mut *c)
        .await?
        .rows_affected();
    }
    Ok(marked)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SQLite's plan for `sql` (its parameters unbound, as NULL), one step a line.
    async fn plan(db: &Db, sql: &str) -> Vec<String> {
        let rows = sqlx::query(&format!("EXPLAIN QUERY PLAN {sql}")).fetch_all(&db.pool).await.unwrap();
        rows.iter().map(|r| r.try_get::<String, _>("detail").unwrap()).collect()
    }

    /// A retention pass lists its candidates through their partial indexes, in digest order,
    /// never by walking every live blob; the one walk that must (SQLite's search for blobs
    /// nobody references) goes in key order, a page at a time, never sorting them all.
    #[tokio::test]
    async fn retention_lists_candidates_through_their_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::connect(&format!("sqlite://{}?mode=rwc", dir.path().join("meta.db").display())).await.unwrap();
        for (sql, index) in [
            (COLLECTABLE, "blobs_in_grace"),
            (STALE_DELETIONS, "blobs_deleting"),
            (UNREFERENCED_WALK, "sqlite_autoindex_blobs_1"),
        ] {
            let plan = plan(&db, sql).await;
            assert!(plan.iter().any(|step| step.contains(&format!("USING INDEX {index}"))), "{sql}: {plan:?}");
            assert!(!plan.iter().any(|step| step.contains("TEMP B-TREE")), "{sql}: {plan:?}");
        }
    }
}
