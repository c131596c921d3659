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
//! - the grace starts from the events that take a blob's references, in their own
//!   transactions: `expire_refs` (time) and `Db::delete_refs` (a caller); each locks the
//!   blobs' rows and decides in a later statement, so a reference committed while it waited
//!   is seen and the grace stays exact (a single `UPDATE … WHERE NOT EXISTS (refs …)` would
//!   mark a just-referenced blob); on SQLite the write transaction sees every committed
//!   reference (nothing commits beside it). `mark_unreferenced_page`, one page a pass, walks
//!   the table for anything an event missed, with the same two steps;
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
/// The walk of `mark_unreferenced_page`: the `$3` blobs after `$1` in digest order, each with
/// whether it is live, out of grace and referenced by nothing live at `$2`. Nothing but the
/// key's range in the `WHERE`, so that every planner walks the primary key a page at a time: with
/// the state and grace terms there, PostgreSQL at 100 k blobs estimated 4 rows and chose a
/// parallel scan of the whole table and a sort (70 ms a page; SQLite, without a `+`, sorted
/// every blob out of grace by `blobs_unreferenced`).
pub(super) const UNREFERENCED_WALK: &str =
    "SELECT b.digest, CASE WHEN b.state = 'live' AND b.unreferenced_since IS NULL \
     AND NOT EXISTS (SELECT 1 FROM refs r WHERE r.digest = b.digest AND (r.pinned = 1 OR r.expires_at > $2)) \
     THEN 1 ELSE 0 END AS unreferenced FROM blobs b WHERE b.digest > $1 ORDER BY b.digest LIMIT $3";
/// Expired, unpinned references, the earliest expiry first: a range of `refs_expires` (pinned
/// references have no expiry and are not in it).
pub(super) const EXPIRED_REFS: &str =
    "SELECT id, digest FROM refs WHERE expires_at <= $1 AND pinned = 0 ORDER BY expires_at LIMIT $2";
/// Blobs whose grace ended by `$1`, after `$2`: through the partial index `blobs_in_grace`
/// (migration 0011), whose condition is this query's `unreferenced_since IS NOT NULL`.
/// Streams past their TTL, `$2` at a time: a range of `streams_expires`.
pub(super) const EXPIRED_STREAMS: &str = "SELECT id FROM streams WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2";
pub(super) const COLLECTABLE: &str =
    "SELECT digest, size FROM blobs WHERE state = 'live' AND unreferenced_since IS NOT NULL \
                           AND unreferenced_since <= $1 AND digest > $2 ORDER BY digest LIMIT $3";
/// Deletions begun by `$1`, after `$2`: through the partial index `blobs_deleting`.
pub(super) const STALE_DELETIONS: &str =
    "SELECT digest, size FROM blobs WHERE state = 'deleting' AND deleting_since <= $1 \
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

    /// Deletes up to `limit` expired, unpinned references, and starts the grace of each blob
    /// that one of them leaves with no live reference, in one transaction; returns how many
    /// references went. This is how a blob loses its references to time, so the grace starts
    /// from these events, never from a walk of every blob.
    ///
    /// The rows of their blobs are locked first, in digest order (PostgreSQL; a SQLite write
    /// transaction holds the whole database): an upload adding a reference holds that row
    /// until it commits, and the marking statement after the locks — a new snapshot under READ
    /// COMMITTED — sees its reference and leaves the blob. The marking reads the expired
    /// references still there (the grace runs from the last one's expiry), then they go.
    /// Everything that takes a blob's row and then a reference's (`delete_refs_where`,
    /// uploads) takes them in that order too, and replicas lock blobs in one order: no
    /// deadlock.
    pub async fn expire_refs(&self, now: i64, limit: i64) -> DbResult<u64> {
        let lock = self.for_update();
        self.write(move |c| {
            Box::pin(async move {
                let page = sqlx::query(EXPIRED_REFS).bind(now).bind(limit).fetch_all(&mut *c).await?;
                if page.is_empty() {
                    return Ok(0);
                }
                let mut ids = Vec::with_capacity(page.len());
                let mut digests = std::collections::BTreeSet::new();
                for row in &page {
                    ids.push(row.try_get::<i64, _>("id")?);
                    digests.insert(row.try_get::<String, _>("digest")?);
                }
                let digests: Vec<String> = digests.into_iter().collect();
                if !lock.is_empty() {
                    let sql = format!(
                        "SELECT digest FROM blobs WHERE digest IN ({}) ORDER BY digest{lock}",
                        marks(1, digests.len())
                    );
                    bind_all(sqlx::query(&sql), &digests).fetch_all(&mut *c).await?;
                }
                mark_all(c, &digests, now).await?;
                let sql = format!(
                    "DELETE FROM refs WHERE pinned = 0 AND expires_at <= $1 AND id IN ({})",
                    marks(2, ids.len())
                );
                let mut q = sqlx::query(&sql).bind(now);
                for id in &ids {
                    q = q.bind(*id);
                }
                Ok(q.execute(&mut *c).await?.rows_affected())
            })
        })
        .await
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

    /// One page of the walk that catches what no event marked: live blobs out of grace that no
    /// live reference points to (left by a crash of an earlier version between its steps, or by
    /// anything else that removes references without [`Db::expire_refs`] or
    /// [`Db::delete_refs`]), `limit` blobs in digest order after `after`. Starts their grace
    /// from their last reference's expiry, or `now`. Returns how many it marked and where the
    /// next page starts (`None`: the walk is done, start again from the first).
    ///
    /// A retention pass takes one page of it, so a pass costs the same whatever the store
    /// holds; the walk goes round the whole table every (blobs / `limit`) passes.
    ///
    /// The page is read from a snapshot on a pooled connection (on SQLite never held by the
    /// writer every upload needs); only the blobs found unreferenced go to a write
    /// transaction, which decides again. PostgreSQL: that transaction first locks them
    /// (skipping rows an upload holds), and the marking statement after the locks — a new
    /// snapshot under READ COMMITTED — sees every reference committed before the locks were
    /// granted; a single `UPDATE … WHERE NOT EXISTS (refs …)` would not do, as when it waits for
    /// a row an upload holds, it re-checks that row but still reads `refs` as of its start.
    /// SQLite: the write transaction holds the whole database and sees every committed
    /// reference. A stale snapshot can only leave out a blob that lost its last reference
    /// during the walk (the next round marks it) or propose one that was just referenced (the
    /// marking leaves it).
    pub async fn mark_unreferenced_page(&self, now: i64, after: &str, limit: i64) -> DbResult<(u64, Option<String>)> {
        let page = sqlx::query(UNREFERENCED_WALK).bind(after).bind(now).bind(limit).fetch_all(&self.pool).await?;
        let mut found = Vec::new();
        for row in &page {
            if row.try_get::<i64, _>("unreferenced")? != 0 {
                found.push(row.try_get::<String, _>("digest")?);
            }
        }
        let next = match page.last() {
            Some(last) if page.len() as i64 == limit => Some(last.try_get::<String, _>("digest")?),
            _ => None,
        };
        if found.is_empty() {
            return Ok((0, next));
        }
        let skip_locked = self.skip_locked();
        let marked = self
            .write(move |c| {
                Box::pin(async move {
                    let found = if skip_locked.is_empty() {
                        found
                    } else {
                        let sql = format!(
                            "SELECT digest FROM blobs WHERE digest IN ({}) ORDER BY digest{skip_locked}",
                            marks(1, found.len())
                        );
                        bind_all(sqlx::query_scalar::<_, String>(&sql), &found).fetch_all(&mut *c).await?
                    };
                    mark_all(c, &found, now).await
                })
            })
            .await?;
        Ok((marked, next))
    }

    /// The whole walk of [`Db::mark_unreferenced_page`], page after page: for tests and an
    /// operator's one-off, never on a timer.
    pub async fn mark_unreferenced(&self, now: i64) -> DbResult<u64> {
        let (mut total, mut after) = (0, String::new());
        loop {
            let (marked, next) = self.mark_unreferenced_page(now, &after, PAGE).await?;
            total += marked;
            match next {
                Some(next) => after = next,
                None => return Ok(total),
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
                // A compacted blob's chunk list goes with it; its packs go once no list needs them,
                // which the next pass checks (`db/chunks.rs`).
                super::chunks::note_packs_of(c, &digest).await?;
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
        let sql = format!("DELETE FROM streams WHERE id IN ({EXPIRED_STREAMS}{})", self.skip_locked());
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
async fn mark_all(c: &mut AnyConnection, digests: &[String], now: i64) -> DbResult<u64> {
    let mut marked = 0;
    for batch in digests.chunks(PAGE as usize) {
        let sql = mark_all_sql(batch.len());
        let q = sqlx::query(&sql).bind(now);
        marked += bind_all(q, batch).execute(&mut *c).await?.rows_affected();
    }
    Ok(marked)
}

/// A query that takes binds (`query` and `query_scalar` alike).
trait Bindable<'q> {
    fn bind_str(self, v: &'q str) -> Self;
}

impl<'q> Bindable<'q> for sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    fn bind_str(self, v: &'q str) -> Self {
        self.bind(v)
    }
}

impl<'q, O> Bindable<'q> for sqlx::query::QueryScalar<'q, sqlx::Any, O, sqlx::any::AnyArguments<'q>> {
    fn bind_str(self, v: &'q str) -> Self {
        self.bind(v)
    }
}

/// The marking statement of [`mark_all`] for `n` digests (`$2`…), `now` in `$1`. The rows are
/// found by their keys: the `+` keeps SQLite off `blobs_unreferenced`, whose entries for
/// `unreferenced_since IS NULL` are every live blob out of grace (it took 0.9 s a page at
/// 1 M outputs through that index, 20 ms by the keys).
pub(super) fn mark_all_sql(n: usize) -> String {
    format!(
        "UPDATE blobs SET unreferenced_since = COALESCE( \
             (SELECT MAX(r.expires_at) FROM refs r WHERE r.digest = blobs.digest), $1) \
         WHERE digest IN ({}) AND state = 'live' AND +unreferenced_since IS NULL \
         AND NOT EXISTS (SELECT 1 FROM refs r WHERE r.digest = blobs.digest \
                         AND (r.pinned = 1 OR r.expires_at > $1))",
        marks(2, n)
    )
}

/// `$from, $from+1, …`: `n` placeholders.
fn marks(from: usize, n: usize) -> String {
    (from..from + n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}

/// Binds each string in order.
fn bind_all<'q, Q: Bindable<'q>>(mut q: Q, values: &'q [String]) -> Q {
    for v in values {
        q = q.bind_str(v);
    }
    q
}
