//! What the store holds, kept: live blobs, their bytes, the bytes of those stored whole, and
//! the bytes of live packs (`store_totals`, migration 0013), read by `stats` and the storage
//! gauges in constant time instead of summed from every row after each pass.
//!
//! # The invariant: the sums equal what a count of the rows would give
//!
//! **The sums are moved by triggers on `blobs` and `packs` (migration 0013), inside the very
//! statement that inserts, deletes or changes a row's `state`, `size`, `inline_data` or
//! `layout`, by the difference between the new row's share and the old one's** (a live row's
//! share: 1, its size, its size again when stored whole; a `deleting` row's: nothing). A
//! statement is atomic, so no crash, failed write or rolled-back savepoint can move one without
//! the other, and no code path can forget to: a new way to change a row moves the sums too.
//! Each statement adds to one shard (PostgreSQL: one of 16, picked at random, so that
//! replicas' uploads rarely wait on the same row lock; SQLite: its one writer, shard 0). A read
//! sums the 16 rows in one statement: under READ COMMITTED, one snapshot of every committed
//! change. Tests compare the sums with a count of the rows after the stress tests.
//!
//! The echo a re-upload of content held already writes into `blob_echoes` has a trigger of
//! the same shape that moves the sums by nothing: both ways still write the same pages.

use sqlx::Row;

use super::error::DbResult;
use super::pool::Db;

/// Live blobs, their bytes, the bytes of those stored whole, the bytes of live packs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Totals {
    /// Live blobs.
    pub blobs: i64,
    /// Their bytes.
    pub logical: i64,
    /// Bytes of those stored whole (inline, or a raw file).
    pub raw: i64,
    /// Bytes of live packs.
    pub packs: i64,
}

impl Db {
    /// The kept sums: 16 rows read, whatever the store holds.
    pub async fn totals(&self) -> DbResult<Totals> {
        read_totals(&mut *self.pool.acquire().await?).await
    }

    /// The kept sums and the same sums counted from every row, read from one snapshot: equal
    /// unless the invariant broke. For the tests (every test server asks at its stop); never on a
    /// timer (it reads every row).
    pub async fn totals_and_count(&self) -> DbResult<(Totals, Totals)> {
        let mut tx = self.pool.begin().await?;
        if self.backend == super::pool::Backend::Postgres {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ").execute(&mut *tx).await?;
        }
        let kept = read_totals(&mut tx).await?;
        let blobs = sqlx::query(
            "SELECT CAST(COUNT(*) AS BIGINT) AS n, CAST(COALESCE(SUM(size), 0) AS BIGINT) AS logical, \
             CAST(COALESCE(SUM(CASE WHEN inline_data IS NOT NULL OR layout = 'raw' THEN size ELSE 0 END), 0) AS BIGINT) AS raw \
             FROM blobs WHERE state = 'live'",
        )
        .fetch_one(&mut *tx)
        .await?;
        let packs: i64 =
            sqlx::query_scalar("SELECT CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM packs WHERE state = 'live'")
                .fetch_one(&mut *tx)
                .await?;
        tx.rollback().await?;
        let counted = Totals {
            blobs: blobs.try_get("n")?,
            logical: blobs.try_get("logical")?,
            raw: blobs.try_get("raw")?,
            packs,
        };
        Ok((kept, counted))
    }
}

async fn read_totals(c: &mut sqlx::AnyConnection) -> DbResult<Totals> {
    let row = sqlx::query(
        "SELECT CAST(COALESCE(SUM(blobs), 0) AS BIGINT) AS blobs, \
         CAST(COALESCE(SUM(logical), 0) AS BIGINT) AS logical, \
         CAST(COALESCE(SUM(raw), 0) AS BIGINT) AS raw, \
         CAST(COALESCE(SUM(packs), 0) AS BIGINT) AS packs FROM store_totals",
    )
    .fetch_one(&mut *c)
    .await?;
    Ok(Totals {
        blobs: row.try_get("blobs")?,
        logical: row.try_get("logical")?,
        raw: row.try_get("raw")?,
        packs: row.try_get("packs")?,
    })
}
