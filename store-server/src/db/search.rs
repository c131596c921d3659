//! The rows of searches across outputs: the pages of references a search walks, and what a
//! walk has passed (`search_seen`), which lets a cursor go on from any replica.

use std::collections::{BTreeMap, HashSet};

use spillway_api::{Digest, Labels, Namespace};
use sqlx::Row;

use super::error::DbResult;
use super::pool::{digest_at, label_conditions, labels_at, Db};

/// Most outputs one search walks: the newest this many that pass its filters.
pub const MAX_SEARCH_OUTPUTS: usize = 100_000;

/// One page of a search's walk (`Db::search_page`): a namespace's live references with ids at
/// most `$5`, newest first, a range of the index `refs_ns_id`; label conditions and the limit
/// follow.
pub(super) const SEARCH_PAGE: &str = "SELECT r.id, r.digest, r.labels FROM refs r WHERE r.namespace = $1 \
     AND r.id <= $5 AND (r.pinned = 1 OR r.expires_at > $2) AND r.created_at >= $3 AND r.created_at <= $4";

/// One reference a search's walk meets: its id, its blob, its labels.
#[derive(Debug, Clone)]
pub struct SearchRef {
    /// The reference's id: the walk's position.
    pub id: i64,
    /// The blob it references.
    pub digest: Digest,
    /// Its labels (shown with the output's matches).
    pub labels: Labels,
}

impl Db {
    /// The newest reference id of `ns` now: the high-water mark of a search that begins, whose
    /// walk never goes above it (references made later are not searched). 0 when there is none.
    pub async fn search_high_water(&self, ns: &Namespace) -> DbResult<i64> {
        let high: Option<i64> = sqlx::query_scalar("SELECT MAX(id) FROM refs WHERE namespace = $1")
            .bind(ns.as_str())
            .fetch_one(&self.pool)
            .await?;
        Ok(high.unwrap_or(0))
    }

    /// Up to `limit` references of `ns` with ids at most `from`, newest first, that are live at
    /// `now` and pass the filters (every label, a creation time in `[since, until]`): one page
    /// of a search's walk.
    #[allow(clippy::too_many_arguments)]
    pub async fn search_page(
        &self,
        ns: &Namespace,
        filter: &BTreeMap<String, String>,
        since: i64,
        until: i64,
        now: i64,
        from: i64,
        limit: i64,
    ) -> DbResult<Vec<SearchRef>> {
        let mut sql = String::from(SEARCH_PAGE);
        let n = label_conditions(&mut sql, filter.len(), 5);
        sql.push_str(&format!(" ORDER BY r.id DESC LIMIT ${}", n + 1));
        let mut q = sqlx::query(&sql).bind(ns.as_str()).bind(now).bind(since).bind(until).bind(from);
        for (k, v) in filter {
            q = q.bind(k).bind(v);
        }
        let rows = q.bind(limit).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                Ok(SearchRef { id: r.try_get("id")?, digest: digest_at(r, "digest")?, labels: labels_at(r, "labels")? })
            })
            .collect()
    }

    /// Of `digests`, those search `search` has passed already (its primary key's lookups).
    pub async fn search_seen(&self, search: &str, digests: &[Digest]) -> DbResult<HashSet<Digest>> {
        let mut out = HashSet::new();
        for batch in digests.chunks(400) {
            let marks: Vec<String> = (2..batch.len() + 2).map(|i| format!("${i}")).collect();
            let sql = format!("SELECT digest FROM search_seen WHERE search = $1 AND digest IN ({})", marks.join(", "));
            let mut q = sqlx::query(&sql).bind(search);
            for d in batch {
                q = q.bind(d.hex());
            }
            for r in q.fetch_all(&self.pool).await? {
                out.insert(digest_at(&r, "digest")?);
            }
        }
        Ok(out)
    }

    /// Records that search `search` has passed `digests`, until `expires_at`.
    pub async fn mark_search_seen(&self, search: &str, digests: &[Digest], expires_at: i64) -> DbResult<()> {
        if digests.is_empty() {
            return Ok(());
        }
        let (search, digests) = (search.to_owned(), digests.to_vec());
        self.write(move |c| {
            Box::pin(async move {
                for batch in digests.chunks(300) {
                    let values: Vec<String> = (0..batch.len()).map(|i| format!("($1, $2, ${})", i + 3)).collect();
                    let sql = format!(
                        "INSERT INTO search_seen (search, expires_at, digest) VALUES {} ON CONFLICT DO NOTHING",
                        values.join(", ")
                    );
                    let mut q = sqlx::query(&sql).bind(&search).bind(expires_at);
                    for d in batch {
                        q = q.bind(d.hex());
                    }
                    q.execute(&mut *c).await?;
                }
                Ok(())
            })
        })
        .await
    }

    /// Removes what searches that expired had passed (and the lists of an earlier version's
    /// searches); how many rows went.
    pub async fn delete_expired_searches(&self, now: i64) -> DbResult<u64> {
        self.write(move |c| {
            Box::pin(async move {
                let mut n = sqlx::query("DELETE FROM search_seen WHERE expires_at <= $1")
                    .bind(now)
                    .execute(&mut *c)
                    .await?
                    .rows_affected();
                n += sqlx::query("DELETE FROM search_snapshots WHERE expires_at <= $1")
                    .bind(now)
                    .execute(&mut *c)
                    .await?
                    .rows_affected();
                Ok(n)
            })
        })
        .await
    }
}
