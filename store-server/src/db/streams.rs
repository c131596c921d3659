//! Streams: background task output appended in offset-checked chunks. The size column is the
//! single point of truth; an append commits only if it moves the size from the value it read,
//! so two replicas can never both accept the same offset.

use bytes::{Bytes, BytesMut};
use spillway_api::{Digest, Labels, Namespace, StreamId, StreamState};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::error::{DbError, DbResult};
use super::pool::{digest_at, labels_at, labels_json, to_i64, Db};
use spillway_api::paging::lines::Checkpoint;

/// A stream as stored.
#[derive(Debug, Clone)]
pub struct StreamRow {
    /// The stream's id.
    pub id: StreamId,
    /// Labels given at creation, for the blob its seal makes.
    pub labels: Labels,
    /// TTL of the blob reference made by sealing.
    pub ttl_ms: i64,
    /// Most bytes the stream takes (its cap).
    pub max_bytes: u64,
    /// Bytes so far.
    pub size: u64,
    /// Newlines so far.
    pub newlines: u64,
    /// Last byte, for the line count.
    pub last_byte: Option<u8>,
    /// Open, capped or sealed.
    pub state: StreamState,
    /// The blob its seal made.
    pub digest: Option<Digest>,
    /// The task's exit code, as its supervisor said at seal.
    pub exit_code: Option<i64>,
    /// The signal that ended the task (`TERM`, `KILL`, …), as its supervisor said at seal.
    pub signal: Option<String>,
    /// True once the stream reached its cap (still true after seal).
    pub hit_cap: bool,
}

impl StreamRow {
    /// Lines as the contract counts them.
    pub fn lines(&self) -> u64 {
        self.newlines + u64::from(self.size > 0 && self.last_byte != Some(b'\n'))
    }
}

/// What an append did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppendOutcome {
    /// Stored (or already stored: a retried append); the new size and state.
    Stored {
        /// The stream's size once this append is stored.
        size: u64,
        /// Its state then: `capped` when this append reached the cap.
        state: StreamState,
        /// Bytes that did not fit under the cap (the stream is now capped).
        dropped: u64,
    },
    /// A retry of the append that reached the cap: what fitted is stored, the rest never will be.
    RetriedAtCap,
    /// No such stream in this namespace.
    NotFound,
    /// Wrong offset; carries the current size.
    OffsetMismatch(u64),
    /// Sealed or capped.
    Closed(StreamState),
}

fn stream_from_row(r: &AnyRow) -> DbResult<StreamRow> {
    let state: String = r.try_get("state")?;
    let id: String = r.try_get("id")?;
    Ok(StreamRow {
        id: StreamId::new(&id).map_err(|_| DbError::corrupt("stream id", id))?,
        labels: labels_at(r, "labels")?,
        ttl_ms: r.try_get("ttl_ms")?,
        max_bytes: r.try_get::<i64, _>("max_bytes")? as u64,
        size: r.try_get::<i64, _>("size")? as u64,
        newlines: r.try_get::<i64, _>("newlines")? as u64,
        last_byte: r.try_get::<Option<i64>, _>("last_byte")?.map(|b| b as u8),
        state: match state.as_str() {
            "capped" => StreamState::Capped,
            "sealed" => StreamState::Sealed,
            _ => StreamState::Open,
        },
        digest: match r.try_get::<Option<String>, _>("digest")? {
            Some(_) => Some(digest_at(r, "digest")?),
            None => None,
        },
        exit_code: r.try_get("exit_code")?,
        signal: r.try_get("signal")?,
        hit_cap: r.try_get::<i64, _>("hit_cap")? != 0,
    })
}

const STREAM_COLS: &str =
    "id, labels, ttl_ms, max_bytes, size, newlines, last_byte, state, digest, exit_code, signal, hit_cap";

impl Db {
    /// Creates an open, empty stream.
    #[allow(clippy::too_many_arguments)]
    pub async fn create_stream(
        &self,
        id: &StreamId,
        ns: &Namespace,
        labels: &Labels,
        ttl_ms: i64,
        max_bytes: u64,
        now: i64,
        max_open: u64,
    ) -> DbResult<bool> {
        let (id, ns, labels) = (id.to_string(), ns.to_string(), labels_json(labels));
        self.write(move |c| {
            Box::pin(async move {
                // Only while the namespace has fewer than `max_open` streams open (and alive);
                // concurrent creations on several replicas may pass it by a few.
                let n = sqlx::query(
                    "INSERT INTO streams (id, namespace, labels, ttl_ms, max_bytes, created_at, expires_at) \
                     SELECT $1, $2, $3, $4, $5, $6, $7 WHERE (SELECT COUNT(*) FROM streams \
                         WHERE namespace = $2 AND state = 'open' AND expires_at > $6) < $8",
                )
                .bind(id)
                .bind(ns.as_str())
                .bind(labels)
                .bind(ttl_ms)
                .bind(to_i64(max_bytes))
                .bind(now)
                .bind(now.saturating_add(ttl_ms))
                .bind(to_i64(max_open))
                .execute(c)
                .await?
                .rows_affected();
                Ok(n == 1)
            })
        })
        .await
    }

    /// The stream if it belongs to `ns`.
    pub async fn get_stream(&self, ns: &Namespace, id: &StreamId) -> DbResult<Option<StreamRow>> {
        let sql = format!("SELECT {STREAM_COLS} FROM streams WHERE namespace = $1 AND id = $2");
        let row = sqlx::query(&sql).bind(ns.as_str()).bind(id.as_str()).fetch_optional(&self.pool).await?;
        row.as_ref().map(stream_from_row).transpose()
    }

    /// Appends `data` at `offset`, which must equal the current size; re-sending bytes
    /// already stored there is a no-op.
    pub async fn append_stream(
        &self,
        ns: &Namespace,
        id: &StreamId,
        offset: u64,
        data: &[u8],
    ) -> DbResult<AppendOutcome> {
        let Some(s) = self.get_stream(ns, id).await? else {
            return Ok(AppendOutcome::NotFound);
        };
        if offset < s.size || (offset == s.size && data.is_empty()) {
            return self.retried(&s, offset, data).await;
        }
        if offset > s.size {
            return Ok(AppendOutcome::OffsetMismatch(s.size));
        }
        if s.state != StreamState::Open {
            return Ok(AppendOutcome::Closed(s.state));
        }
        let take = (s.max_bytes - s.size.min(s.max_bytes)).min(data.len() as u64) as usize;
        let part = &data[..take];
        let dropped = (data.len() - take) as u64;
        let new_state = if dropped > 0 { StreamState::Capped } else { StreamState::Open };
        let moved = self.extend(&s, part, new_state).await?;
        if moved == 0 {
            // Another writer moved the stream first: answer from its new state.
            let now = self.get_stream(ns, id).await?;
            return Ok(match now {
                None => AppendOutcome::NotFound,
                Some(n) if n.state != StreamState::Open && n.size == s.size => AppendOutcome::Closed(n.state),
                Some(n) => AppendOutcome::OffsetMismatch(n.size),
            });
        }
        Ok(AppendOutcome::Stored { size: s.size + take as u64, state: new_state, dropped })
    }

    /// Writes the next piece of a stream and its new size, if the stream is still open at the
    /// size it was read at; 0 when another writer moved it first.
    async fn extend(&self, s: &StreamRow, part: &[u8], new_state: StreamState) -> DbResult<u64> {
        let newlines = s.newlines + memchr::memchr_iter(b'\n', part).count() as u64;
        let last_byte = part.last().map(|&b| i64::from(b)).or(s.last_byte.map(i64::from));
        let (sid, old, old_newlines, chunk) = (s.id.to_string(), s.size, s.newlines, part.to_vec());
        self.write(move |c| {
            Box::pin(async move {
                let moved = sqlx::query(
                    "UPDATE streams SET size = $1, newlines = $2, last_byte = $3, state = $4, hit_cap = $7 \
                         WHERE id = $5 AND size = $6 AND state = 'open'",
                )
                .bind(to_i64(old + chunk.len() as u64))
                .bind(to_i64(newlines))
                .bind(last_byte)
                .bind(new_state.as_str())
                .bind(&sid)
                .bind(to_i64(old))
                .bind(i64::from(new_state == StreamState::Capped))
                .execute(&mut *c)
                .await?
                .rows_affected();
                if moved == 1 && !chunk.is_empty() {
                    sqlx::query("INSERT INTO stream_chunks (stream_id, start, newlines, data) VALUES ($1, $2, $3, $4)")
                        .bind(&sid)
                        .bind(to_i64(old))
                        .bind(to_i64(old_newlines))
                        .bind(chunk)
                        .execute(&mut *c)
                        .await?;
                }
                Ok(moved)
            })
        })
        .await
    }

    /// An append at an offset already written: a retry when the bytes it carries are those
    /// stored there (up to the cap, for the append that reached it), else a wrong offset.
    async fn retried(&self, s: &StreamRow, offset: u64, data: &[u8]) -> DbResult<AppendOutcome> {
        let end = offset.saturating_add(data.len() as u64);
        let held = end.min(s.size);
        if self.read_stream(&s.id, offset, held).await?.as_ref() == &data[..(held - offset) as usize] {
            if end <= s.size {
                return Ok(AppendOutcome::Stored { size: s.size, state: s.state, dropped: 0 });
            }
            if s.state == StreamState::Capped && s.size == s.max_bytes {
                return Ok(AppendOutcome::RetriedAtCap);
            }
        }
        Ok(AppendOutcome::OffsetMismatch(s.size))
    }

    /// Bytes `start..end` of a stream.
    pub async fn read_stream(&self, id: &StreamId, start: u64, end: u64) -> DbResult<Bytes> {
        let first = self.stream_checkpoint_for_offset(id, start).await?.offset;
        let rows = sqlx::query(
            "SELECT start, data FROM stream_chunks WHERE stream_id = $1 AND start >= $2 AND start < $3 ORDER BY start",
        )
        .bind(id.as_str())
        .bind(to_i64(first))
        .bind(to_i64(end))
        .fetch_all(&self.pool)
        .await?;
        let mut out = BytesMut::with_capacity((end - start) as usize);
        for r in rows {
            let at = r.try_get::<i64, _>("start")? as u64;
            let data: Vec<u8> = r.try_get("data")?;
            let from = start.saturating_sub(at).min(data.len() as u64) as usize;
            let to = (end - at).min(data.len() as u64) as usize;
            if from < to {
                out.extend_from_slice(&data[from..to]);
            }
        }
        Ok(out.freeze())
    }

    async fn stream_checkpoint(&self, sql: &str, id: &StreamId, v: u64) -> DbResult<Checkpoint> {
        let row = sqlx::query(sql).bind(id.as_str()).bind(to_i64(v)).fetch_optional(&self.pool).await?;
        Ok(match row {
            Some(r) => Checkpoint {
                offset: r.try_get::<i64, _>("start")? as u64,
                newlines: r.try_get::<i64, _>("newlines")? as u64,
            },
            None => Checkpoint { offset: 0, newlines: 0 },
        })
    }

    /// The chunk start at or before `offset`, with the newlines before it.
    pub async fn stream_checkpoint_for_offset(&self, id: &StreamId, offset: u64) -> DbResult<Checkpoint> {
        let sql = "SELECT start, newlines FROM stream_chunks WHERE stream_id = $1 AND start <= $2 \
                   ORDER BY start DESC LIMIT 1";
        self.stream_checkpoint(sql, id, offset).await
    }

    /// The last chunk start at or before the start of `line`.
    pub async fn stream_checkpoint_for_line(&self, id: &StreamId, line: u64) -> DbResult<Checkpoint> {
        let sql = "SELECT start, newlines FROM stream_chunks WHERE stream_id = $1 AND newlines < $2 \
                   ORDER BY start DESC LIMIT 1";
        self.stream_checkpoint(sql, id, line.saturating_sub(1)).await
    }

    /// Stops appends: open or capped becomes sealed, recording how the task ended when its
    /// supervisor says so (a retried seal may say it again; what was said first is kept).
    /// Returns the row after.
    pub async fn close_stream(
        &self,
        ns: &Namespace,
        id: &StreamId,
        exit_code: Option<i64>,
        signal: Option<String>,
    ) -> DbResult<Option<StreamRow>> {
        let (n, i) = (ns.to_string(), id.to_string());
        self.write(move |c| {
            Box::pin(async move {
                sqlx::query(
                    "UPDATE streams SET state = 'sealed', exit_code = COALESCE(exit_code, $3), \
                     signal = COALESCE(signal, $4) WHERE namespace = $1 AND id = $2",
                )
                .bind(n)
                .bind(i)
                .bind(exit_code)
                .bind(signal)
                .execute(c)
                .await?;
                Ok(())
            })
        })
        .await?;
        self.get_stream(ns, id).await
    }

    /// Records the sealed blob and drops the chunks, unless another seal got there first.
    pub async fn finish_seal(&self, id: &StreamId, digest: &Digest) -> DbResult<()> {
        let (id, digest) = (id.to_string(), digest.hex());
        self.write(move |c| {
            Box::pin(async move {
                let n = sqlx::query("UPDATE streams SET digest = $1 WHERE id = $2 AND digest IS NULL")
                    .bind(digest)
                    .bind(&id)
                    .execute(&mut *c)
                    .await?
                    .rows_affected();
                if n == 1 {
                    sqlx::query("DELETE FROM stream_chunks WHERE stream_id = $1").bind(&id).execute(&mut *c).await?;
                }
                Ok(())
            })
        })
        .await
    }
}
