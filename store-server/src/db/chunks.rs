//! The SQL of storage v2: chunks, the packs that hold them, the chunk lists of compacted blobs,
//! and the one lease that keeps compaction to one server at a time.
//!
//! # The invariant: a pack goes only when no blob's chunk list needs it
//!
//! **A pack's object is removed only inside a transaction that holds the pack's row (PostgreSQL:
//! `SELECT … FOR UPDATE`; SQLite: the write transaction), finds it `deleting`, and — in a
//! statement issued after the lock was granted — finds no `blob_chunks` row naming a chunk
//! stored in it. A pack is claimed (`live` → `deleting`) the same way.**
//!
//! Every transaction that adds chunk lists (`commit_compaction`) locks, after writing its own
//! chunk rows, the row of every pack its list points into, and goes on only if all are
//! `live`. So a compaction and a pack's deletion serialize on the pack's row: if the
//! compaction commits first, the deleter's re-check sees its list and leaves the pack; if the
//! claim commits first, the compaction sees `deleting` and gives up (its own new packs go; the
//! blob stays raw and the next pass tries again). A chunk row that points into a pack being
//! deleted is pointed at the compaction's own copy when it wrote one. The blob's row is
//! locked first and must be `live` and `raw`: a compaction never races a deletion of its blob
//! (which locks that row too), and two compactions of one blob do not both commit.
//!
//! Retention learns which packs may have lost their last list from `pack_checks`: every
//! transaction that removes a chunk list (a blob's deletion, a repair back to raw) or points a
//! chunk at another pack (a compaction) notes the packs concerned in it, and a pass checks
//! those, never every pack. A check removes its note first, then locks and decides
//! ([`Db::claim_pack`]); a note is written with `ON CONFLICT … DO UPDATE`, which waits for a
//! check that is removing the same note (PostgreSQL). So a list removed while a pack is being
//! checked either commits before the check's decision (which then sees it gone) or writes its
//! note after the check removed the old one (and the next pass checks again): no pack is left
//! unneeded and unnoted.
//!
//! A compacted blob's raw copy is removed only after its chunk list committed; a crash
//! between leaves a raw copy of a `chunked` blob, which retention's sweep removes. A crash
//! after a pack was written and before its commit leaves a pack with no row: the sweep
//! removes it once older than the deletion lease, claiming it with a `deleting` row first (a
//! compaction committing that pack's row then fails and gives up).

use std::collections::{HashMap, HashSet};

use spillway_api::Digest;
use sqlx::{AnyConnection, Row};

use super::error::{DbError, DbResult};
use super::pool::{digest_at, to_i64, Db};

/// What compaction takes next: raw blobs stored as files, live, written by `$1`, after
/// `($2, $3)` in (written, digest) order — a range of the partial index `blobs_compactable`
/// (migration 0013), which holds exactly the blobs stored as files and not compacted yet, so a
/// pass reads what became old enough and nothing else. (The index's entry is written by a new
/// upload of content stored as a file; the echo a re-upload of such content writes enters the
/// same index on `blob_echoes`, so that both still write alike.)
pub(super) const COMPACTABLE: &str =
    "SELECT digest, size, created_at FROM blobs WHERE inline_data IS NULL AND layout = 'raw' \
                           AND state = 'live' AND created_at <= $1 AND (created_at, digest) > ($2, $3) \
                           ORDER BY created_at, digest LIMIT $4";

/// Where a chunk's bytes are: a zstd frame in a pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkLoc {
    /// BLAKE3 of the chunk's raw bytes.
    pub digest: Digest,
    /// The pack that holds its frame.
    pub pack: String,
    /// Where the frame starts in the pack.
    pub pack_offset: u64,
    /// Bytes of the frame.
    pub length: u64,
    /// Bytes of the chunk, decompressed.
    pub raw_length: u64,
}

/// A pack written by a compaction, about to be recorded.
#[derive(Debug, Clone)]
pub struct NewPack {
    /// 32 hex.
    pub id: String,
    /// Bytes of its object.
    pub size: u64,
}

/// What a compaction records for one blob: the packs it wrote, the chunks in them, and the
/// blob's chunk list (each chunk's digest and where it starts in the blob).
#[derive(Debug, Clone, Default)]
pub struct Compacted {
    /// Packs written for this blob.
    pub packs: Vec<NewPack>,
    /// The chunks those packs hold.
    pub chunks: Vec<ChunkLoc>,
    /// The blob's chunks in order, with their raw offsets.
    pub list: Vec<(Digest, u64)>,
}

/// What the store holds: bytes stored (after dedup and compression) and logical bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StorageStats {
    /// Raw copies of live blobs not yet compacted (inline ones included) plus live packs.
    pub stored_bytes: u64,
    /// Each distinct live blob's size, once.
    pub logical_bytes: u64,
    /// Live blobs.
    pub blobs: u64,
    /// Outputs whose stored bytes are marked as failing their hash (api.md v1.3).
    pub corrupt: u64,
}

/// How a note in `pack_checks` is written: over a note being removed by a check, it waits for
/// that check and then writes its own (see the module's invariants).
const NOTE: &str = "ON CONFLICT (pack) DO UPDATE SET pack = excluded.pack";

/// The noted packs after `$1`, in id order, `$2` at a time: the primary key's range.
pub(super) const PACK_CHECKS: &str = "SELECT pack FROM pack_checks WHERE pack > $1 ORDER BY pack LIMIT $2";

/// Deletions of packs begun by `$1`, `$2` at a time: through the partial index `packs_deleting`.
pub(super) const STALE_PACK_DELETIONS: &str =
    "SELECT id, size FROM packs WHERE state = 'deleting' AND deleting_since <= $1 ORDER BY id LIMIT $2";

/// Rows an `IN (…)` list or a multi-row insert takes at a time.
const BATCH: usize = 400;

pub(super) fn chunk_from_row(r: &sqlx::any::AnyRow) -> DbResult<ChunkLoc> {
    Ok(ChunkLoc {
        digest: digest_at(r, "digest")?,
        pack: r.try_get("pack")?,
        pack_offset: r.try_get::<i64, _>("pack_offset")? as u64,
        length: r.try_get::<i64, _>("length")? as u64,
        raw_length: r.try_get::<i64, _>("raw_length")? as u64,
    })
}

fn marks(from: usize, n: usize) -> String {
    (from..from + n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}

impl Db {
    /// Of these chunks, those stored in a live pack, by digest.
    pub async fn stored_chunks(&self, digests: &[Digest]) -> DbResult<HashMap<Digest, ChunkLoc>> {
        let mut out = HashMap::new();
        for batch in digests.chunks(BATCH) {
            let sql = format!(
                "SELECT c.digest, c.pack, c.pack_offset, c.length, c.raw_length FROM chunks c \
                 JOIN packs p ON p.id = c.pack WHERE p.state = 'live' AND c.digest IN ({}) \
                 AND NOT EXISTS (SELECT 1 FROM damaged_chunks d WHERE d.digest = c.digest)",
                marks(1, batch.len())
            );
            let mut q = sqlx::query(&sql);
            for d in batch {
                q = q.bind(d.hex());
            }
            for r in q.fetch_all(&self.pool).await? {
                let loc = chunk_from_row(&r)?;
                out.insert(loc.digest, loc);
            }
        }
        Ok(out)
    }

    /// A compacted blob's chunks in order, each with where it starts in the blob.
    pub async fn blob_chunks(&self, blob: &Digest) -> DbResult<Vec<(u64, ChunkLoc)>> {
        let rows = sqlx::query(
            "SELECT bc.raw_offset, c.digest, c.pack, c.pack_offset, c.length, c.raw_length \
             FROM blob_chunks bc JOIN chunks c ON c.digest = bc.chunk WHERE bc.blob = $1 ORDER BY bc.seq",
        )
        .bind(blob.hex())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((r.try_get::<i64, _>("raw_offset")? as u64, chunk_from_row(r)?))).collect()
    }

    /// Raw blobs stored as files or objects (not inline), live, written by `before`, after
    /// `after` (when written, digest), oldest first: what compaction takes next. Each with its
    /// size and when it was written (the next page's start).
    pub async fn compactable(
        &self,
        before: i64,
        after: Option<(i64, Digest)>,
        limit: i64,
    ) -> DbResult<Vec<(Digest, u64, i64)>> {
        let (at, digest) = after.map_or((i64::MIN, String::new()), |(at, d)| (at, d.hex()));
        let rows =
            sqlx::query(COMPACTABLE).bind(before).bind(at).bind(digest).bind(limit).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| Ok((digest_at(r, "digest")?, r.try_get::<i64, _>("size")? as u64, r.try_get("created_at")?)))
            .collect()
    }

    /// Records a blob's compaction (see the module's invariant): its packs, their chunks, its
    /// chunk list, and `layout = 'chunked'`. False when it cannot: the blob is no longer a
    /// live raw blob, or a pack its list needs is being deleted. Nothing is recorded then.
    pub async fn commit_compaction(&self, blob: &Digest, c: Compacted, now: i64) -> DbResult<bool> {
        let (blob, lock_blob, lock_pack) = (
            blob.hex(),
            format!("SELECT state, layout FROM blobs WHERE digest = $1{}", self.for_update()),
            format!("SELECT state FROM packs WHERE id = $1{}", self.for_update()),
        );
        self.write(move |conn| {
            Box::pin(async move {
                let row = sqlx::query(&lock_blob).bind(&blob).fetch_optional(&mut *conn).await?;
                let live_raw = row.is_some_and(|r| {
                    r.try_get::<String, _>("state").is_ok_and(|s| s == "live")
                        && r.try_get::<String, _>("layout").is_ok_and(|l| l == "raw")
                });
                if !live_raw {
                    return Ok(false);
                }
                for p in &c.packs {
                    let n = sqlx::query(
                        "INSERT INTO packs (id, size, created_at, state) VALUES ($1, $2, $3, 'live') \
                         ON CONFLICT (id) DO NOTHING",
                    )
                    .bind(&p.id)
                    .bind(to_i64(p.size))
                    .bind(now)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected();
                    if n == 0 {
                        return Err(DbError::unavailable("a swept pack id came back; retry"));
                        // rolls back
                    }
                    // A new pack whose every chunk turned out stored already is needed by no
                    // list: checked once like any other.
                    sqlx::query(&format!("INSERT INTO pack_checks (pack) VALUES ($1) {NOTE}"))
                        .bind(&p.id)
                        .execute(&mut *conn)
                        .await?;
                }
                insert_chunks(conn, &c.chunks).await?;
                // Every pack the list points into, locked in one order, must be live.
                let digests: Vec<String> = c.list.iter().map(|(d, _)| d.hex()).collect();
                let mut packs = std::collections::BTreeSet::new();
                for batch in digests.chunks(BATCH) {
                    let sql = format!("SELECT DISTINCT pack FROM chunks WHERE digest IN ({})", marks(1, batch.len()));
                    let mut q = sqlx::query_scalar::<_, String>(&sql);
                    for d in batch {
                        q = q.bind(d);
                    }
                    packs.extend(q.fetch_all(&mut *conn).await?);
                }
                for pack in &packs {
                    let state: Option<String> =
                        sqlx::query_scalar(&lock_pack).bind(pack).fetch_optional(&mut *conn).await?;
                    if state.as_deref() != Some("live") {
                        return Err(DbError::Conflict); // rolls back; the compaction gives up
                    }
                }
                insert_list(conn, &blob, &c.list).await?;
                sqlx::query("UPDATE blobs SET layout = 'chunked' WHERE digest = $1")
                    .bind(&blob)
                    .execute(&mut *conn)
                    .await?;
                Ok(true)
            })
        })
        .await
        .or_else(|e| if matches!(e, DbError::Conflict) { Ok(false) } else { Err(e) })
    }

    /// Live packs after `after` whose chunks no blob's list names, found by walking every pack:
    /// for tests and diagnostics, never on a timer (a pass checks the noted packs).
    pub async fn unreferenced_packs(&self, after: Option<&str>, limit: i64) -> DbResult<Vec<(String, u64)>> {
        let rows = sqlx::query(
            "SELECT id, size FROM packs p WHERE state = 'live' AND id > $1 AND NOT EXISTS \
             (SELECT 1 FROM chunks c JOIN blob_chunks bc ON bc.chunk = c.digest WHERE c.pack = p.id) \
             ORDER BY id LIMIT $2",
        )
        .bind(after.unwrap_or_default())
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((r.try_get("id")?, r.try_get::<i64, _>("size")? as u64))).collect()
    }

    /// Packs noted for a check, after `after`, in id order: what a retention pass checks.
    pub async fn pack_checks(&self, after: Option<&str>, limit: i64) -> DbResult<Vec<String>> {
        Ok(sqlx::query_scalar(PACK_CHECKS).bind(after.unwrap_or_default()).bind(limit).fetch_all(&self.pool).await?)
    }

    /// Checks a pack: removes its note, then claims it for deletion (`live` → `deleting`) if
    /// no list needs it, deciding after the lock (see the module's invariants).
    pub async fn claim_pack(&self, id: &str, now: i64) -> DbResult<bool> {
        let (id, lock) = (id.to_owned(), format!("SELECT state FROM packs WHERE id = $1{}", self.for_update()));
        self.write(move |c| {
            Box::pin(async move {
                sqlx::query("DELETE FROM pack_checks WHERE pack = $1").bind(&id).execute(&mut *c).await?;
                let state: Option<String> = sqlx::query_scalar(&lock).bind(&id).fetch_optional(&mut *c).await?;
                if state.as_deref() != Some("live") || pack_referenced(c, &id).await? {
                    return Ok(false);
                }
                let n = sqlx::query("UPDATE packs SET state = 'deleting', deleting_since = $2 WHERE id = $1")
                    .bind(&id)
                    .bind(now)
                    .execute(&mut *c)
                    .await?
                    .rows_affected();
                Ok(n == 1)
            })
        })
        .await
    }

    /// Deletions of packs a crashed pass left half-done before `stale_before`.
    pub async fn stale_pack_deletions(&self, stale_before: i64, limit: i64) -> DbResult<Vec<(String, u64)>> {
        let rows = sqlx::query(STALE_PACK_DELETIONS).bind(stale_before).bind(limit).fetch_all(&self.pool).await?;
        rows.iter().map(|r| Ok((r.try_get("id")?, r.try_get::<i64, _>("size")? as u64))).collect()
    }

    /// Second phase of a pack's deletion, holding its row: if still `deleting` and unneeded,
    /// `remove` deletes the object, then the pack's chunk rows and its row go.
    /// `Ok(Ok(Some(size)))`: deleted; `Ok(Ok(None))`: nothing to do; `Ok(Err(e))`: the object
    /// could not be removed, the row stays claimed.
    pub async fn delete_claimed_pack<E: Send + 'static>(
        &self,
        id: &str,
        remove: Box<dyn FnOnce() -> futures::future::BoxFuture<'static, Result<(), E>> + Send>,
    ) -> DbResult<Result<Option<u64>, E>> {
        let (id, lock) = (id.to_owned(), format!("SELECT state, size FROM packs WHERE id = $1{}", self.for_update()));
        self.write(move |c| {
            Box::pin(async move {
                let Some(row) = sqlx::query(&lock).bind(&id).fetch_optional(&mut *c).await? else {
                    return Ok(Ok(None));
                };
                let (state, size): (String, i64) = (row.try_get("state")?, row.try_get("size")?);
                if state != "deleting" || pack_referenced(c, &id).await? {
                    return Ok(Ok(None));
                }
                if let Err(e) = remove().await {
                    return Ok(Err(e));
                }
                sqlx::query("DELETE FROM chunks WHERE pack = $1").bind(&id).execute(&mut *c).await?;
                sqlx::query("DELETE FROM packs WHERE id = $1").bind(&id).execute(&mut *c).await?;
                Ok(Ok(Some(size as u64)))
            })
        })
        .await
    }

    /// Of these pack ids, those that have a row.
    pub async fn known_packs(&self, ids: &[String]) -> DbResult<HashSet<String>> {
        let mut out = HashSet::new();
        for batch in ids.chunks(BATCH) {
            let sql = format!("SELECT id FROM packs WHERE id IN ({})", marks(1, batch.len()));
            let mut q = sqlx::query_scalar::<_, String>(&sql);
            for id in batch {
                q = q.bind(id);
            }
            out.extend(q.fetch_all(&self.pool).await?);
        }
        Ok(out)
    }

    /// Claims a pack object that has no row (a compaction that crashed before its commit) with a
    /// `deleting` row, so that such a commit fails; false when a row appeared first.
    pub async fn claim_orphan_pack(&self, id: &str, size: u64, now: i64) -> DbResult<bool> {
        let id = id.to_owned();
        self.write(move |c| {
            Box::pin(async move {
                let n = sqlx::query(
                    "INSERT INTO packs (id, size, created_at, state, deleting_since) VALUES ($1, $2, $3, 'deleting', $3) \
                     ON CONFLICT (id) DO NOTHING",
                )
                .bind(id)
                .bind(to_i64(size))
                .bind(now)
                .execute(c)
                .await?
                .rows_affected();
                Ok(n == 1)
            })
        })
        .await
    }

    /// Removes the raw copy of a compacted blob with `remove`, holding the blob's row and
    /// finding it `chunked` after the lock: a raw copy is removed only while the chunks are
    /// the blob, never under a row that a deletion and a new upload made raw again meanwhile.
    /// `Ok(Ok(true))`: removed; `Ok(Ok(false))`: the blob is raw (or gone) now, nothing done.
    pub async fn delete_raw_copy<E: Send + 'static>(
        &self,
        digest: &Digest,
        remove: Box<dyn FnOnce() -> futures::future::BoxFuture<'static, Result<(), E>> + Send>,
    ) -> DbResult<Result<bool, E>> {
        let (digest, lock) = (digest.hex(), format!("SELECT layout FROM blobs WHERE digest = $1{}", self.for_update()));
        self.write(move |c| {
            Box::pin(async move {
                let layout: Option<String> = sqlx::query_scalar(&lock).bind(&digest).fetch_optional(&mut *c).await?;
                if layout.as_deref() != Some("chunked") {
                    return Ok(Ok(false));
                }
                Ok(remove().await.map(|()| true))
            })
        })
        .await
    }

    /// Of these digests, the blobs that are compacted (their raw copies are leftovers).
    pub async fn chunked_blobs(&self, digests: &[Digest]) -> DbResult<HashSet<Digest>> {
        let mut out = HashSet::new();
        for batch in digests.chunks(BATCH) {
            let sql =
                format!("SELECT digest FROM blobs WHERE layout = 'chunked' AND digest IN ({})", marks(1, batch.len()));
            let mut q = sqlx::query(&sql);
            for d in batch {
                q = q.bind(d.hex());
            }
            for r in q.fetch_all(&self.pool).await? {
                out.insert(digest_at(&r, "digest")?);
            }
        }
        Ok(out)
    }

    /// Stored and logical bytes of what is live (api.md v1.2, Storage efficiency), from the
    /// kept sums (`db/totals.rs`): constant time, whatever the store holds. A blob inline in
    /// its row is never compacted, so it counts as stored whole.
    pub async fn storage_stats(&self) -> DbResult<StorageStats> {
        let t = self.totals().await?;
        Ok(StorageStats {
            stored_bytes: (t.raw + t.packs) as u64,
            logical_bytes: t.logical as u64,
            blobs: t.blobs as u64,
            corrupt: self.count_damaged().await?,
        })
    }

    /// Takes (or renews) the lease `name` for `holder` until `until`, unless another holder
    /// has it and it has not run out at `now`.
    pub async fn take_lease(&self, name: &str, holder: &str, now: i64, until: i64) -> DbResult<bool> {
        let (name, holder) = (name.to_owned(), holder.to_owned());
        self.write(move |c| {
            Box::pin(async move {
                let n = sqlx::query(
                    "INSERT INTO leases (name, holder, until) VALUES ($1, $2, $3) ON CONFLICT (name) DO UPDATE \
                     SET holder = excluded.holder, until = excluded.until \
                     WHERE leases.holder = excluded.holder OR leases.until <= $4",
                )
                .bind(name)
                .bind(holder)
                .bind(until)
                .bind(now)
                .execute(c)
                .await?
                .rows_affected();
                Ok(n == 1)
            })
        })
        .await
    }

    /// Gives a lease back.
    pub async fn release_lease(&self, name: &str, holder: &str) -> DbResult<()> {
        let (name, holder) = (name.to_owned(), holder.to_owned());
        self.write(move |c| {
            Box::pin(async move {
                sqlx::query("DELETE FROM leases WHERE name = $1 AND holder = $2")
                    .bind(name)
                    .bind(holder)
                    .execute(c)
                    .await?;
                Ok(())
            })
        })
        .await
    }
}

/// Whether any blob's chunk list names a chunk stored in pack `id` (a new statement: under
/// READ COMMITTED it sees every list committed before it began).
async fn pack_referenced(c: &mut AnyConnection, id: &str) -> DbResult<bool> {
    let n: i64 = sqlx::query_scalar(
        "SELECT CAST(COUNT(*) AS BIGINT) FROM chunks c JOIN blob_chunks bc ON bc.chunk = c.digest WHERE c.pack = $1",
    )
    .bind(id)
    .fetch_one(&mut *c)
    .await?;
    Ok(n > 0)
}

/// Notes, for retention's next check, the packs that blob `blob`'s chunk list points into:
/// called just before the list is removed.
pub(super) async fn note_packs_of(c: &mut AnyConnection, blob: &str) -> DbResult<()> {
    sqlx::query(&format!(
        "INSERT INTO pack_checks (pack) SELECT DISTINCT ch.pack FROM blob_chunks bc \
         JOIN chunks ch ON ch.digest = bc.chunk WHERE bc.blob = $1 {NOTE}"
    ))
    .bind(blob)
    .execute(&mut *c)
    .await?;
    Ok(())
}

/// New chunk rows; a chunk already recorded keeps its row unless the pack it points into is no
/// longer live, in which case it is pointed at this copy (and the pack it pointed into is noted
/// for a check).
async fn insert_chunks(c: &mut AnyConnection, chunks: &[ChunkLoc]) -> DbResult<()> {
    for batch in chunks.chunks(BATCH / 5) {
        let sql = format!(
            "INSERT INTO pack_checks (pack) SELECT DISTINCT pack FROM chunks WHERE digest IN ({}) {NOTE}",
            marks(1, batch.len())
        );
        let mut q = sqlx::query(&sql);
        for ch in batch {
            q = q.bind(ch.digest.hex());
        }
        q.execute(&mut *c).await?;
        let values: Vec<String> = (0..batch.len()).map(|i| format!("({})", marks(i * 5 + 1, 5))).collect();
        let sql = format!(
            "INSERT INTO chunks (digest, pack, pack_offset, length, raw_length) VALUES {} \
             ON CONFLICT (digest) DO UPDATE SET pack = excluded.pack, pack_offset = excluded.pack_offset, \
             length = excluded.length, raw_length = excluded.raw_length \
             WHERE NOT EXISTS (SELECT 1 FROM packs p WHERE p.id = chunks.pack AND p.state = 'live') \
             OR EXISTS (SELECT 1 FROM damaged_chunks d WHERE d.digest = chunks.digest)",
            values.join(", ")
        );
        let mut q = sqlx::query(&sql);
        for ch in batch {
            q = q
                .bind(ch.digest.hex())
                .bind(ch.pack.clone())
                .bind(to_i64(ch.pack_offset))
                .bind(to_i64(ch.length))
                .bind(to_i64(ch.raw_length));
        }
        q.execute(&mut *c).await?;
        // A damaged chunk stored afresh (stored_chunks never offers one for reuse) is mended.
        let sql = format!("DELETE FROM damaged_chunks WHERE digest IN ({})", marks(1, batch.len()));
        let mut q = sqlx::query(&sql);
        for ch in batch {
            q = q.bind(ch.digest.hex());
        }
        q.execute(&mut *c).await?;
    }
    Ok(())
}

/// A blob's chunk list.
async fn insert_list(c: &mut AnyConnection, blob: &str, list: &[(Digest, u64)]) -> DbResult<()> {
    for (k, batch) in list.chunks(BATCH / 4).enumerate() {
        let values: Vec<String> = (0..batch.len()).map(|i| format!("({})", marks(i * 4 + 1, 4))).collect();
        let sql = format!("INSERT INTO blob_chunks (blob, seq, chunk, raw_offset) VALUES {}", values.join(", "));
        let mut q = sqlx::query(&sql);
        for (i, (chunk, offset)) in batch.iter().enumerate() {
            q = q.bind(blob.to_owned()).bind((k * (BATCH / 4) + i) as i64).bind(chunk.hex()).bind(to_i64(*offset));
        }
        q.execute(&mut *c).await?;
    }
    Ok(())
}
