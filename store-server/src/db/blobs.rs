//! Blobs and the references that make them visible in a namespace.
//!
//! A blob row is written only after its bytes are durable (or, for bytes completed in place,
//! in the transaction that completes them), and a reference is only ever added in a
//! transaction that first writes its blob's row — inserting it, clearing its grace, or taking
//! it back from retention — so that it serializes with a deletion on that row (on SQLite,
//! whose write transaction holds the whole database, a live row out of grace is read
//! instead). The invariant this keeps, and why it holds under READ COMMITTED, is written in
//! `db/retention.rs`.

use std::collections::BTreeMap;

use rusqlite::OptionalExtension as _;
use spillway_api::{Digest, Labels, Namespace, Sha256Digest};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::error::{DbError, DbResult};
use super::pool::{digest_at, label_conditions, labels_at, labels_json, to_i64, Db};

/// A stored blob.
#[derive(Debug, Clone)]
pub struct BlobRow {
    /// Its BLAKE3, the key of its bytes.
    pub digest: Digest,
    /// Its SHA-256, by which it can be looked up too.
    pub sha256: Sha256Digest,
    /// Size in bytes.
    pub size: u64,
    /// Lines, counted as the line index counts them.
    pub lines: u64,
    /// Encoded line index (`spillway_api::paging::lines::LineIndex`).
    pub line_index: Vec<u8>,
    /// The bytes themselves, for a blob small enough to be stored inline.
    pub inline_data: Option<Vec<u8>>,
    /// Compacted: its bytes are its chunk list (`blob_chunks`), no longer a raw copy.
    pub chunked: bool,
}

impl BlobRow {
    /// The blob's record as the API answers it.
    pub fn record(&self, deduplicated: bool, expires_at: Option<String>) -> spillway_api::BlobRecord {
        spillway_api::BlobRecord {
            digest: self.digest,
            sha256: self.sha256.to_string(),
            size: self.size,
            lines: self.lines,
            deduplicated,
            expires_at,
        }
    }
}

/// A reference to add.
#[derive(Debug, Clone)]
pub struct NewRef {
    /// The namespace that holds the reference.
    pub namespace: Namespace,
    /// The blob referenced.
    pub digest: Digest,
    /// Labels given at upload.
    pub labels: Labels,
    /// `None` for a pin.
    pub expires_at: Option<i64>,
    /// Why it is pinned.
    pub pin_reason: Option<String>,
}

/// One reference as listed.
#[derive(Debug, Clone)]
pub struct RefRow {
    /// The reference's row id; listing pages resume below it (`cursor`).
    pub id: i64,
    /// The blob referenced.
    pub digest: Digest,
    /// The blob's size in bytes.
    pub size: u64,
    /// Lines as the contract counts them.
    pub lines: u64,
    /// Labels given at upload.
    pub labels: Labels,
    /// When the reference was made, in milliseconds since the epoch.
    pub created_at: i64,
    /// Millis; `None` for a pin.
    pub expires_at: Option<i64>,
    /// True when pinned: the reference never expires.
    pub pinned: bool,
}

/// Where a blob is in its life. A blob row is written `live`; retention moves it to
/// `deleting` (claimed: its bytes are going) and then removes the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobState {
    /// Stored and referenceable.
    Live,
    /// Claimed by retention: a new upload of the same content waits, then publishes again.
    Deleting,
}

impl BlobState {
    fn parse(s: String) -> DbResult<Self> {
        match s.as_str() {
            "live" => Ok(Self::Live),
            "deleting" => Ok(Self::Deleting),
            _ => Err(DbError::corrupt("blob state", s)),
        }
    }
}

/// Outcome of trying to reference an existing blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddRef {
    /// Referenced; `deduplicated` is true when the namespace already held it.
    Added {
        /// The namespace held a live reference before.
        deduplicated: bool,
    },
    /// No such blob: its bytes must be published first.
    Absent,
    /// Retention is deleting it: wait for that to finish, then publish again.
    Deleting,
}

pub(super) const VISIBLE: &str = "EXISTS (SELECT 1 FROM refs r WHERE r.namespace = $1 AND r.digest = b.digest \
                       AND (r.pinned = 1 OR r.expires_at > $2))";

fn blob_from_row(r: &AnyRow) -> DbResult<BlobRow> {
    Ok(BlobRow {
        digest: digest_at(r, "digest")?,
        sha256: {
            let hex: String = r.try_get("sha256")?;
            Sha256Digest::from_hex(&hex).ok_or_else(|| DbError::corrupt("sha256", hex))?
        },
        size: r.try_get::<i64, _>("size")? as u64,
        lines: r.try_get::<i64, _>("lines")? as u64,
        line_index: r.try_get("line_index")?,
        inline_data: r.try_get("inline_data")?,
        chunked: {
            let layout: String = r.try_get("layout")?;
            match layout.as_str() {
                "raw" => false,
                "chunked" => true,
                _ => return Err(DbError::corrupt("blob layout", layout)),
            }
        },
    })
}

async fn holds(c: &mut AnyConnection, ns: &Namespace, digest: &Digest, now: i64) -> DbResult<bool> {
    let n: i64 = sqlx::query_scalar(
        "SELECT CAST(COUNT(*) AS BIGINT) FROM refs WHERE namespace = $1 AND digest = $2 \
         AND (pinned = 1 OR expires_at > $3)",
    )
    .bind(ns.as_str())
    .bind(digest.hex())
    .bind(now)
    .fetch_one(&mut *c)
    .await?;
    Ok(n > 0)
}

async fn insert_ref(c: &mut AnyConnection, r: &NewRef, now: i64) -> DbResult<()> {
    let labels = labels_json(&r.labels);
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO refs (namespace, digest, labels, created_at, expires_at, pinned, pin_reason) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
    )
    .bind(r.namespace.as_str())
    .bind(r.digest.hex())
    .bind(labels)
    .bind(now)
    .bind(r.expires_at)
    .bind(i64::from(r.expires_at.is_none()))
    .bind(r.pin_reason.as_deref())
    .fetch_one(&mut *c)
    .await?;
    for (k, v) in &r.labels {
        sqlx::query("INSERT INTO ref_labels (ref_id, key, value) VALUES ($1, $2, $3)")
            .bind(id)
            .bind(k)
            .bind(v)
            .execute(&mut *c)
            .await?;
    }
    Ok(())
}

/// Completes bytes written straight to their key, inside the transaction that references
/// them (see [`Db::add_ref`]); its error is the blob store's.
pub type Complete<E> = Box<dyn FnOnce() -> futures::future::BoxFuture<'static, Result<(), E>> + Send>;

/// What [`Db::add_ref`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Referenced {
    /// The namespace held a live reference before.
    pub deduplicated: bool,
    /// The row was `deleting` (claimed by retention) and is live again.
    pub took_back: bool,
    /// The row was live, and kept so: its bytes are there.
    pub kept: bool,
}

/// The three ways to hold content's row for a new reference, each one statement that touches
/// the row (so that it takes the row lock a deleter holds, and PostgreSQL re-checks a waiting
/// retention statement against the new row version).
#[derive(Debug, Clone, Copy)]
enum Hold {
    Insert,
    Keep,
    TakeBack,
}

/// The statements to try, the likely one first.
fn hold_order(hint: Option<BlobState>) -> [Hold; 3] {
    match hint {
        None => [Hold::Insert, Hold::Keep, Hold::TakeBack],
        Some(BlobState::Live) => [Hold::Keep, Hold::TakeBack, Hold::Insert],
        Some(BlobState::Deleting) => [Hold::TakeBack, Hold::Keep, Hold::Insert],
    }
}

/// Inserts, keeps or takes back the row of `b`; says which. Tries the statement
/// `hint` suggests first; each statement that finds nothing to do moves on to the next (the row
/// appeared, went live, or was deleted by a deleter whose lock it waited for meanwhile).
async fn hold_row(c: &mut AnyConnection, b: &BlobRow, now: i64, hint: Option<BlobState>) -> DbResult<Hold> {
    let order = hold_order(hint);
    // Each round ends with a row held unless rows come and go between its three statements;
    // a few rounds settle any such churn.
    for _ in 0..8 {
        for step in order {
            let q = match step {
                Hold::Insert => sqlx::query(
                    "INSERT INTO blobs (digest, sha256, size, lines, line_index, created_at, inline_data, state) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, 'live') ON CONFLICT (digest) DO NOTHING",
                ),
                Hold::Keep => {
                    sqlx::query("UPDATE blobs SET unreferenced_since = NULL WHERE digest = $1 AND state = 'live'")
                }
                Hold::TakeBack => sqlx::query(
                    "UPDATE blobs SET state = 'live', unreferenced_since = NULL, deleting_since = NULL, \
                     sha256 = $2, size = $3, lines = $4, line_index = $5, created_at = $6, inline_data = $7 \
                     WHERE digest = $1 AND state = 'deleting'",
                ),
            };
            let q = q.bind(b.digest.hex());
            let q = match step {
                Hold::Keep => q,
                Hold::Insert | Hold::TakeBack => q
                    .bind(b.sha256.hex())
                    .bind(to_i64(b.size))
                    .bind(to_i64(b.lines))
                    .bind(&b.line_index)
                    .bind(now)
                    .bind(b.inline_data.as_deref()),
            };
            if q.execute(&mut *c).await?.rows_affected() == 1 {
                return Ok(step);
            }
        }
    }
    Err(DbError::unavailable("the content's row kept changing; retry"))
}

/// [`hold_row`] on the SQLite writer's own connection, inside its write transaction, which
/// holds the whole database: nothing else changes the row between the statements, so it is
/// read first and the statement it needs is the one run. `hint` is not needed here.
///
/// Content held already, live and out of grace, needs no write to its row; in its place the
/// re-upload writes its [echo](echo_row). So both ways take the same statements on the same
/// values — a read of the row by its digest, then the insert of one such row into a table of
/// the same shape — and dirty as many pages (a leaf of the table, one of each index, overflow
/// pages for the same length), whatever the machine's balance between CPU and disk. Other
/// states (in grace, being deleted) write the row itself: rare, and only ever content nobody
/// references.
fn hold_row_natively(c: &rusqlite::Connection, b: &BlobRow, now: i64) -> DbResult<Hold> {
    let (digest, sha256) = (b.digest.hex(), b.sha256.hex());
    let found: Option<(String, Option<i64>)> = c
        .prepare_cached("SELECT state, unreferenced_since FROM blobs WHERE digest = ?1")?
        .query_row([&digest], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    // What a new row holds, and what a taken-back row is rewritten with.
    let (size, lines) = (to_i64(b.size), to_i64(b.lines));
    let whole_row = rusqlite::params![digest, sha256, size, lines, b.line_index, now, b.inline_data];
    let (step, n) = match found.as_ref().map(|(state, grace)| (BlobState::parse(state.clone()), grace)) {
        None => (
            Hold::Insert,
            c.prepare_cached(
                "INSERT INTO blobs (digest, sha256, size, lines, line_index, created_at, inline_data, state) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'live') ON CONFLICT (digest) DO NOTHING",
            )?
            .execute(whole_row)?,
        ),
        Some((Ok(BlobState::Live), None)) => (Hold::Keep, echo_row(c, b, &digest, &sha256, now)?),
        Some((Ok(BlobState::Live), Some(_))) => (
            Hold::Keep,
            c.prepare_cached("UPDATE blobs SET unreferenced_since = NULL WHERE digest = ?1 AND state = 'live'")?
                .execute([&digest])?,
        ),
        Some((Ok(BlobState::Deleting), _)) => (
            Hold::TakeBack,
            c.prepare_cached(
                "UPDATE blobs SET state = 'live', unreferenced_since = NULL, deleting_since = NULL, \
                 sha256 = ?2, size = ?3, lines = ?4, line_index = ?5, created_at = ?6, inline_data = ?7 \
                 WHERE digest = ?1 AND state = 'deleting'",
            )?
            .execute(whole_row)?,
        ),
        Some((Err(e), _)) => return Err(e),
    };
    if n != 1 {
        return Err(DbError::unavailable("the content's row changed under the writer; retry"));
    }
    Ok(step)
}

/// What a re-upload of live content writes in place of its row: the row a new upload of it
/// would insert — its digest and SHA-256, as long a line index and inline content, but zeros
/// (no second copy of anything) — into `blob_echoes`, a table of the same shape nothing reads.
/// The SQLite writer empties it every [`ECHO_PURGE_EVERY`](super::pool::ECHO_PURGE_EVERY).
fn echo_row(c: &rusqlite::Connection, b: &BlobRow, digest: &str, sha256: &str, now: i64) -> rusqlite::Result<usize> {
    c.prepare_cached(
        "INSERT INTO blob_echoes (digest, sha256, size, lines, line_index, created_at, inline_data, state) \
         VALUES (?1, ?2, ?3, ?4, zeroblob(?5), ?6, iif(?7 IS NULL, NULL, zeroblob(?7)), 'live')",
    )?
    .execute(rusqlite::params![
        digest,
        sha256,
        to_i64(b.size),
        to_i64(b.lines),
        to_i64(b.line_index.len() as u64),
        now,
        b.inline_data.as_ref().map(|d| to_i64(d.len() as u64))
    ])
}

impl Db {
    /// The blob if `namespace` holds a live reference to it.
    pub async fn visible_blob(&self, ns: &Namespace, digest: &Digest, now: i64) -> DbResult<Option<BlobRow>> {
        let sql = format!(
            "SELECT digest, sha256, size, lines, line_index, inline_data, layout FROM blobs b \
             WHERE {VISIBLE} AND b.digest = $3 AND b.state = 'live'"
        );
        let row = sqlx::query(&sql).bind(ns.as_str()).bind(now).bind(digest.hex()).fetch_optional(&self.pool).await?;
        row.as_ref().map(blob_from_row).transpose()
    }

    /// Like [`Db::visible_blob`], looked up by SHA-256.
    pub async fn visible_blob_by_sha256(
        &self,
        ns: &Namespace,
        sha256: &Sha256Digest,
        now: i64,
    ) -> DbResult<Option<BlobRow>> {
        let sql = format!(
            "SELECT digest, sha256, size, lines, line_index, inline_data, layout FROM blobs b \
             WHERE {VISIBLE} AND b.sha256 = $3 AND b.state = 'live' LIMIT 1"
        );
        let row = sqlx::query(&sql).bind(ns.as_str()).bind(now).bind(sha256.hex()).fetch_optional(&self.pool).await?;
        row.as_ref().map(blob_from_row).transpose()
    }

    /// What `namespace` holds, for its quota: the size of each distinct blob it has a live
    /// reference to, once, plus what its open streams hold.
    pub async fn namespace_usage(&self, ns: &Namespace, now: i64) -> DbResult<u64> {
        let blobs: i64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM blobs WHERE digest IN \
             (SELECT digest FROM refs WHERE namespace = $1 AND (pinned = 1 OR expires_at > $2))",
        )
        .bind(ns.as_str())
        .bind(now)
        .fetch_one(&self.pool)
        .await?;
        let streams: i64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM streams \
             WHERE namespace = $1 AND state <> 'sealed' AND expires_at > $2",
        )
        .bind(ns.as_str())
        .bind(now)
        .fetch_one(&self.pool)
        .await?;
        Ok((blobs + streams).max(0) as u64)
    }

    /// Whether `namespace` holds a live reference to the blob.
    pub async fn holds_blob(&self, ns: &Namespace, digest: &Digest, now: i64) -> DbResult<bool> {
        Ok(self.visible_until(ns, digest, now).await?.is_some())
    }

    /// The blob's state, or `None` when there is no such blob.
    pub async fn blob_state(&self, digest: &Digest) -> DbResult<Option<BlobState>> {
        let state: Option<String> = sqlx::query_scalar("SELECT state FROM blobs WHERE digest = $1")
            .bind(digest.hex())
            .fetch_optional(&self.pool)
            .await?;
        state.map(BlobState::parse).transpose()
    }

    /// Until when `namespace` sees the blob (`i64::MAX` for a pin), or `None` when it holds no
    /// live reference. A referenced blob is always live: retention only claims blobs nothing
    /// references.
    pub async fn visible_until(&self, ns: &Namespace, digest: &Digest, now: i64) -> DbResult<Option<i64>> {
        Ok(sqlx::query_scalar(
            "SELECT CAST(MAX(CASE WHEN pinned = 1 THEN $4 ELSE expires_at END) AS BIGINT) FROM refs \
             WHERE namespace = $1 AND digest = $2 AND (pinned = 1 OR expires_at > $3)",
        )
        .bind(ns.as_str())
        .bind(digest.hex())
        .bind(now)
        .bind(i64::MAX)
        .fetch_one(&self.pool)
        .await?)
    }

    /// A live blob's row whatever its references (its fields depend only on its content).
    pub async fn blob_row(&self, digest: &Digest) -> DbResult<Option<BlobRow>> {
        let row =
            sqlx::query("SELECT digest, sha256, size, lines, line_index, inline_data, layout FROM blobs WHERE digest = $1 AND state = 'live'")
                .bind(digest.hex())
                .fetch_optional(&self.pool)
                .await?;
        row.as_ref().map(blob_from_row).transpose()
    }

    /// References a blob that is already stored and live, keeping it from collection.
    pub async fn add_ref_if_live(&self, r: &NewRef, now: i64) -> DbResult<AddRef> {
        let r = r.clone();
        self.write_prefix_safe(move |c| {
            Box::pin(async move {
                let kept =
                    sqlx::query("UPDATE blobs SET unreferenced_since = NULL WHERE digest = $1 AND state = 'live'")
                        .bind(r.digest.hex())
                        .execute(&mut *c)
                        .await?
                        .rows_affected();
                if kept == 0 {
                    let state: Option<String> = sqlx::query_scalar("SELECT state FROM blobs WHERE digest = $1")
                        .bind(r.digest.hex())
                        .fetch_optional(&mut *c)
                        .await?;
                    return Ok(if state.is_some() { AddRef::Deleting } else { AddRef::Absent });
                }
                let deduplicated = holds(c, &r.namespace, &r.digest, now).await?;
                insert_ref(c, &r, now).await?;
                Ok(AddRef::Added { deduplicated })
            })
        })
        .await
    }

    /// References content whose bytes the caller has (published, or about to be completed by
    /// `complete`), in one transaction: the row is inserted when there is none, kept when it is
    /// live (its grace cleared), or **taken back** when retention has claimed it (`deleting`
    /// → `live`, described by `b`: the caller's bytes are what it holds now). `hint` is the
    /// state the caller saw, to try the likely statement first. Never waits for a deleter
    /// beyond the row lock of one byte deletion ([`Db::delete_claimed`]).
    ///
    /// `publish`, when given, runs inside the transaction once the row is held, if the row was
    /// inserted or taken back (a kept live row has its bytes): bytes written straight to their
    /// key (a direct multipart upload) are completed there, and a re-upload of content that
    /// was live publishes there only if it was not — so no deleter can remove the bytes
    /// between their publication and the reference.
    pub async fn add_ref<E: std::error::Error + Send + Sync + 'static>(
        &self,
        b: &BlobRow,
        r: &NewRef,
        now: i64,
        hint: Option<BlobState>,
        publish: Option<Complete<E>>,
    ) -> DbResult<Referenced> {
        // On SQLite, through the writer's own connection (all but bytes completed in place).
        if publish.is_none() {
            if let Some(done) = self.add_ref_natively(b, r, now).await {
                return done;
            }
        }
        let (b, r) = (b.clone(), r.clone());
        self.write_prefix_safe(move |c| {
            Box::pin(async move {
                let held = hold_row(c, &b, now, hint).await?;
                if let (Some(publish), false) = (publish, matches!(held, Hold::Keep)) {
                    publish().await.map_err(|e| DbError::Bytes(std::sync::Arc::new(e)))?;
                }
                let deduplicated = holds(c, &r.namespace, &r.digest, now).await?;
                insert_ref(c, &r, now).await?;
                Ok(Referenced {
                    deduplicated,
                    took_back: matches!(held, Hold::TakeBack),
                    kept: matches!(held, Hold::Keep),
                })
            })
        })
        .await
    }

    /// On SQLite: [`Db::add_ref`] on the writer's own connection, in its group commit (cached
    /// statements, no hop to sqlx's worker per statement) — new content or not, so that an
    /// upload of content another namespace holds costs the same one commit as fresh content
    /// and its timing tells nothing. `None`: no native writer here.
    async fn add_ref_natively(&self, b: &BlobRow, r: &NewRef, now: i64) -> Option<DbResult<Referenced>> {
        let (b, r) = (b.clone(), r.clone());
        self.write_native(move |c| {
            let held = hold_row_natively(c, &b, now)?;
            let deduplicated: i64 = c
                .prepare_cached(
                    "SELECT COUNT(*) FROM refs WHERE namespace = ?1 AND digest = ?2 \
                     AND (pinned = 1 OR expires_at > ?3)",
                )?
                .query_row(rusqlite::params![r.namespace.as_str(), r.digest.hex(), now], |row| row.get(0))?;
            let id: i64 = c
                .prepare_cached(
                    "INSERT INTO refs (namespace, digest, labels, created_at, expires_at, pinned, pin_reason) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) RETURNING id",
                )?
                .query_row(
                    rusqlite::params![
                        r.namespace.as_str(),
                        r.digest.hex(),
                        labels_json(&r.labels),
                        now,
                        r.expires_at,
                        i64::from(r.expires_at.is_none()),
                        r.pin_reason
                    ],
                    |row| row.get(0),
                )?;
            let mut label = c.prepare_cached("INSERT INTO ref_labels (ref_id, key, value) VALUES (?1, ?2, ?3)")?;
            for (k, v) in &r.labels {
                label.execute(rusqlite::params![id, k, v])?;
            }
            Ok(Referenced {
                deduplicated: deduplicated > 0,
                took_back: matches!(held, Hold::TakeBack),
                kept: matches!(held, Hold::Keep),
            })
        })
        .await
    }

    /// Runs a reference deletion and, when it took the blob's last live reference, starts
    /// the blob's grace period now (not at the next retention pass).
    async fn delete_refs_where(&self, sql: &'static str, ns: &Namespace, digest: &Digest, now: i64) -> DbResult<u64> {
        let (ns, digest) = (ns.to_string(), digest.hex());
        // The blob's row first: an upload adding a reference meanwhile holds it, and the
        // statements below then read (a new snapshot) what it committed.
        let lock = format!("SELECT digest FROM blobs WHERE digest = $1{}", self.for_update());
        self.write(move |c| {
            Box::pin(async move {
                sqlx::query(&lock).bind(&digest).fetch_optional(&mut *c).await?;
                let n = sqlx::query(sql).bind(&ns).bind(&digest).execute(&mut *c).await?.rows_affected();
                sqlx::query(
                    "UPDATE blobs SET unreferenced_since = $2 WHERE digest = $1 AND state = 'live' \
                     AND unreferenced_since IS NULL AND NOT EXISTS (SELECT 1 FROM refs r \
                     WHERE r.digest = blobs.digest AND (r.pinned = 1 OR r.expires_at > $2))",
                )
                .bind(&digest)
                .bind(now)
                .execute(&mut *c)
                .await?;
                Ok(n)
            })
        })
        .await
    }

    /// Removes this namespace's pins of a blob; returns how many there were.
    pub async fn unpin(&self, ns: &Namespace, digest: &Digest, now: i64) -> DbResult<u64> {
        let sql = "DELETE FROM refs WHERE namespace = $1 AND digest = $2 AND pinned = 1";
        self.delete_refs_where(sql, ns, digest, now).await
    }

    /// Removes all of this namespace's references to a blob; returns how many there were.
    pub async fn delete_refs(&self, ns: &Namespace, digest: &Digest, now: i64) -> DbResult<u64> {
        self.delete_refs_where("DELETE FROM refs WHERE namespace = $1 AND digest = $2", ns, digest, now).await
    }

    /// A page of this namespace's live references, newest first, filtered by labels, and by
    /// the blob they name when `digest` is given.
    pub async fn list_refs(
        &self,
        ns: &Namespace,
        filter: &BTreeMap<String, String>,
        digest: Option<&Digest>,
        before_id: Option<i64>,
        limit: u32,
        now: i64,
    ) -> DbResult<Vec<RefRow>> {
        let sql = list_refs_sql(filter.len(), digest.is_some());
        let mut q = sqlx::query(&sql).bind(ns.as_str()).bind(now).bind(before_id.unwrap_or(i64::MAX));
        for (k, v) in filter {
            q = q.bind(k).bind(v);
        }
        if let Some(d) = digest {
            q = q.bind(d.hex());
        }
        let rows = q.bind(i64::from(limit)).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                Ok(RefRow {
                    id: r.try_get("id")?,
                    digest: digest_at(r, "digest")?,
                    size: r.try_get::<i64, _>("size")? as u64,
                    lines: r.try_get::<i64, _>("lines")? as u64,
                    labels: labels_at(r, "labels")?,
                    created_at: r.try_get("created_at")?,
                    expires_at: r.try_get("expires_at")?,
                    pinned: r.try_get::<i64, _>("pinned")? != 0,
                })
            })
            .collect()
    }
}

/// The listing of references with `labels` label filters, and one digest when `digest`: by the
/// digest, its newest references are read in order from `refs_digest_ns_id` on both databases
/// (`db::plans`).
pub(crate) fn list_refs_sql(labels: usize, digest: bool) -> String {
    let mut sql = String::from(
        "SELECT r.id, r.digest, r.labels, r.created_at, r.expires_at, r.pinned, b.size, b.lines \
         FROM refs r JOIN blobs b ON b.digest = r.digest \
         WHERE r.namespace = $1 AND (r.pinned = 1 OR r.expires_at > $2) AND r.id < $3",
    );
    let mut n = label_conditions(&mut sql, labels, 3);
    if digest {
        n += 1;
        sql.push_str(&format!(" AND r.digest = ${n}"));
    }
    sql.push_str(" ORDER BY r.id DESC");
    sql.push_str(&format!(" LIMIT ${}", n + 1));
    sql
}
