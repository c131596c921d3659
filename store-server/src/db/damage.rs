//! The SQL of integrity (api.md v1.3): marks on outputs and chunks whose stored bytes failed
//! their hash, and the walks a scrub makes. A mark is written by whoever finds the damage (a
//! read, a download, a scrub) and removed by what repairs it (an upload of the same content, a
//! compaction that stores a damaged chunk afresh, a scrub that finds the bytes good again).
//! Marks are idempotent and carry no invariant of their own: a mark set or cleared twice, or
//! by two replicas at once, is the same mark.

use spillway_api::Digest;
use sqlx::Row;

use super::error::DbResult;
use super::pool::{digest_at, Db};

/// A live blob as a scrub checks it.
#[derive(Debug, Clone)]
pub struct ScrubBlob {
    /// Its content's digest.
    pub digest: Digest,
    /// Bytes.
    pub size: u64,
    /// Its bytes when held in its row.
    pub inline_data: Option<Vec<u8>>,
    /// Compacted: its bytes are its chunks, which the scrub checks apart.
    pub chunked: bool,
}

impl Db {
    /// Marks `digest`'s stored bytes damaged (`kind`: `corrupt` or `missing`).
    pub async fn mark_damaged(&self, digest: &Digest, kind: &'static str, now: i64) -> DbResult<()> {
        let digest = digest.hex();
        self.write(move |c| {
            Box::pin(async move {
                sqlx::query(
                    "INSERT INTO damaged_blobs (digest, kind, found_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (digest) DO UPDATE SET kind = excluded.kind",
                )
                .bind(digest)
                .bind(kind)
                .bind(now)
                .execute(c)
                .await?;
                Ok(())
            })
        })
        .await
    }

    /// Removes `digest`'s mark (its bytes were stored again, or found good).
    pub async fn clear_damaged(&self, digest: &Digest) -> DbResult<()> {
        let digest = digest.hex();
        self.write(move |c| {
            Box::pin(async move {
                sqlx::query("DELETE FROM damaged_blobs WHERE digest = $1").bind(digest).execute(c).await?;
                Ok(())
            })
        })
        .await
    }

    /// Every marked output: what each server keeps in memory and refuses to read.
    pub async fn damaged_blobs(&self) -> DbResult<Vec<Digest>> {
        let rows = sqlx::query("SELECT digest FROM damaged_blobs").fetch_all(&self.pool).await?;
        rows.iter().map(|r| digest_at(r, "digest")).collect()
    }

    /// Marks chunks damaged, and every live blob whose chunk list names one of them `corrupt`;
    /// returns those blobs.
    pub async fn mark_chunks_damaged(&self, chunks: &[Digest], now: i64) -> DbResult<Vec<Digest>> {
        let chunks: Vec<String> = chunks.iter().map(Digest::hex).collect();
        self.write(move |c| {
            Box::pin(async move {
                let mut blobs = Vec::new();
                for chunk in &chunks {
                    sqlx::query(
                        "INSERT INTO damaged_chunks (digest, found_at) VALUES ($1, $2) ON CONFLICT (digest) DO NOTHING",
                    )
                    .bind(chunk)
                    .bind(now)
                    .execute(&mut *c)
                    .await?;
                    let rows = sqlx::query("SELECT DISTINCT blob FROM blob_chunks WHERE chunk = $1")
                        .bind(chunk)
                        .fetch_all(&mut *c)
                        .await?;
                    for r in &rows {
                        let blob: String = r.try_get("blob")?;
                        sqlx::query(
                            "INSERT INTO damaged_blobs (digest, kind, found_at) VALUES ($1, 'corrupt', $2) \
                             ON CONFLICT (digest) DO NOTHING",
                        )
                        .bind(&blob)
                        .bind(now)
                        .execute(&mut *c)
                        .await?;
                        blobs.push(digest_at(r, "blob")?);
                    }
                }
                Ok(blobs)
            })
        })
        .await
    }

    /// How many outputs are marked (`stats`' `corrupt`).
    pub async fn count_damaged(&self) -> DbResult<u64> {
        let n: i64 =
            sqlx::query_scalar("SELECT CAST(COUNT(*) AS BIGINT) FROM damaged_blobs").fetch_one(&self.pool).await?;
        Ok(n as u64)
    }

    /// Live blobs with digests in `[from, to)` after `after`, in digest order, `limit` at a
    /// time: a scrub's walk (the primary key's range).
    pub async fn scrub_blobs(
        &self,
        from: &str,
        to: &str,
        after: Option<&Digest>,
        limit: i64,
    ) -> DbResult<Vec<ScrubBlob>> {
        let after = after.map_or_else(|| from.to_owned(), Digest::hex);
        let op = if after.as_str() == from { ">=" } else { ">" };
        let sql = format!(
            "SELECT digest, size, inline_data, layout FROM blobs WHERE state = 'live' AND digest {op} $1 \
             AND digest < $2 ORDER BY digest LIMIT $3"
        );
        let rows = sqlx::query(&sql).bind(after).bind(to.to_owned()).bind(limit).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                Ok(ScrubBlob {
                    digest: digest_at(r, "digest")?,
                    size: r.try_get::<i64, _>("size")? as u64,
                    inline_data: r.try_get::<Option<Vec<u8>>, _>("inline_data")?,
                    chunked: r.try_get::<String, _>("layout")? == "chunked",
                })
            })
            .collect()
    }

    /// Chunks with digests in `[from, to)` after `after` that live blobs' lists name, in
    /// digest order: a scrub's walk of the chunk store.
    pub async fn scrub_chunks(
        &self,
        from: &str,
        to: &str,
        after: Option<&Digest>,
        limit: i64,
    ) -> DbResult<Vec<super::ChunkLoc>> {
        let after = after.map_or_else(|| from.to_owned(), Digest::hex);
        let op = if after.as_str() == from { ">=" } else { ">" };
        let sql = format!(
            "SELECT c.digest, c.pack, c.pack_offset, c.length, c.raw_length FROM chunks c \
             WHERE c.digest {op} $1 AND c.digest < $2 \
             AND EXISTS (SELECT 1 FROM blob_chunks bc WHERE bc.chunk = c.digest) ORDER BY c.digest LIMIT $3"
        );
        let rows = sqlx::query(&sql).bind(after).bind(to.to_owned()).bind(limit).fetch_all(&self.pool).await?;
        rows.iter().map(super::chunks::chunk_from_row).collect()
    }

    /// Whether `blob`'s chunks include one marked damaged.
    pub async fn has_damaged_chunk(&self, blob: &Digest) -> DbResult<bool> {
        let n: i64 = sqlx::query_scalar(
            "SELECT CAST(COUNT(*) AS BIGINT) FROM blob_chunks bc JOIN damaged_chunks d ON d.digest = bc.chunk \
             WHERE bc.blob = $1",
        )
        .bind(blob.hex())
        .fetch_one(&self.pool)
        .await?;
        Ok(n > 0)
    }

    /// Makes a compacted blob raw again, before an upload that repairs it publishes its bytes
    /// whole: its chunk list goes (its chunks stay for other blobs; packs nobody needs go with
    /// retention). Its mark stays until those bytes are published.
    pub async fn restore_raw(&self, blob: &Digest) -> DbResult<()> {
        let blob = blob.hex();
        self.write(move |c| {
            Box::pin(async move {
                super::chunks::note_packs_of(c, &blob).await?;
                sqlx::query("DELETE FROM blob_chunks WHERE blob = $1").bind(&blob).execute(&mut *c).await?;
                sqlx::query("UPDATE blobs SET layout = 'raw' WHERE digest = $1").bind(&blob).execute(&mut *c).await?;
                Ok(())
            })
        })
        .await
    }
}
