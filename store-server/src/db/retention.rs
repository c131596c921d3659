//! The SQL of retention: expire references, note blobs nobody references, claim them for
//! deletion (two-phase: `live` → `deleting` → row removed after the bytes are gone).
//! Every step works in pages ordered by key, and PostgreSQL replicas skip rows another
//! replica has locked instead of colliding with it.

use spillway_api::Digest;
use sqlx::Row;

use super::error::{DbError, DbResult};
use super::pool::{digest_at, Backend, Db};

impl Db {
    fn skip_locked(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => " FOR UPDATE SKIP LOCKED",
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

    /// Starts the grace period of every live blob whose references have all expired, from the
    /// moment the last of them expired: the grace is exact, whenever the pass runs.
    pub async fn mark_expired(&self, now: i64) -> DbResult<u64> {
        self.write(move |c| {
            Box::pin(async move {
                let sql = "UPDATE blobs SET unreferenced_since = \
                               (SELECT MAX(r.expires_at) FROM refs r WHERE r.digest = blobs.digest) \
                           WHERE state = 'live' AND unreferenced_since IS NULL \
                           AND EXISTS (SELECT 1 FROM refs r WHERE r.digest = blobs.digest) \
                           AND NOT EXISTS (SELECT 1 FROM refs r WHERE r.digest = blobs.digest \
                                           AND (r.pinned = 1 OR r.expires_at > $1))";
                Ok(sqlx::query(sql).bind(now).execute(c).await?.rows_affected())
            })
        })
        .await
    }

    /// Starts the grace period of every live blob that no reference points to (one whose
    /// references went some other way, such as a crash between steps).
    pub async fn mark_unreferenced(&self, now: i64) -> DbResult<u64> {
        self.write(move |c| {
            Box::pin(async move {
                let sql =
                    "UPDATE blobs SET unreferenced_since = $1 WHERE state = 'live' AND unreferenced_since IS NULL \
                           AND NOT EXISTS (SELECT 1 FROM refs r WHERE r.digest = blobs.digest)";
                Ok(sqlx::query(sql).bind(now).execute(c).await?.rows_affected())
            })
        })
        .await
    }

    /// Digests after `after` (from the first when `None`) whose grace period ended by `cutoff`, in key order.
    pub async fn collectable(&self, cutoff: i64, after: Option<&Digest>, limit: i64) -> DbResult<Vec<(Digest, u64)>> {
        let rows = sqlx::query(
            "SELECT digest, size FROM blobs WHERE state = 'live' AND unreferenced_since IS NOT NULL \
             AND unreferenced_since <= $1 AND digest > $2 ORDER BY digest LIMIT $3",
        )
        .bind(cutoff)
        .bind(after.map_or_else(String::new, Digest::hex))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((digest_at(r, "digest")?, r.try_get::<i64, _>("size")? as u64))).collect()
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
        let rows = sqlx::query(
            "SELECT digest, size FROM blobs WHERE state = 'deleting' AND deleting_since <= $1 \
             AND digest > $2 ORDER BY digest LIMIT $3",
        )
        .bind(stale_before)
        .bind(after.map_or_else(String::new, Digest::hex))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((digest_at(r, "digest")?, r.try_get::<i64, _>("size")? as u64))).collect()
    }

    /// Second phase: the bytes are gone, so the row goes.
    pub async fn forget_blob(&self, digest: &Digest) -> DbResult<bool> {
        let digest = digest.hex();
        self.write(move |c| {
            Box::pin(async move {
                let n = sqlx::query("DELETE FROM blobs WHERE digest = $1 AND state = 'deleting'")
                    .bind(digest)
                    .execute(c)
                    .await?
                    .rows_affected();
                Ok(n == 1)
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
