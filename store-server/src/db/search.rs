//! The rows of searches across outputs: which outputs a search walks, and the snapshots of
//! that list that let a cursor go on from any replica.

use std::collections::{BTreeMap, HashSet};

use spillway_api::{Digest, Labels, Namespace};
use sqlx::Row;

use super::error::{DbError, DbResult};
use super::pool::{digest_at, label_conditions, labels_at, Db};

/// Most outputs one search walks: the newest this many references that pass its filters.
pub const MAX_SEARCH_OUTPUTS: usize = 100_000;

/// One output a search walks, with the labels of its newest matching reference.
pub type SearchOutput = (Digest, Labels);

impl Db {
    /// The outputs `ns` references now whose reference passes the filters (every label, and a
    /// creation time in `[since, until]`): each blob once, by its newest such reference, newest
    /// first.
    pub async fn search_outputs(
        &self,
        ns: &Namespace,
        filter: &BTreeMap<String, String>,
        since: i64,
        until: i64,
        now: i64,
    ) -> DbResult<Vec<SearchOutput>> {
        let mut sql = String::from(
            "SELECT r.digest, r.labels FROM refs r WHERE r.namespace = $1 AND (r.pinned = 1 OR r.expires_at > $2) \
             AND r.created_at >= $3 AND r.created_at <= $4",
        );
        let n = label_conditions(&mut sql, filter, 4);
        sql.push_str(&format!(" ORDER BY r.created_at DESC, r.id DESC LIMIT ${}", n + 1));
        let mut q = sqlx::query(&sql).bind(ns.as_str()).bind(now).bind(since).bind(until);
        for (k, v) in filter {
            q = q.bind(k).bind(v);
        }
        let rows = q.bind(MAX_SEARCH_OUTPUTS as i64).fetch_all(&self.pool).await?;
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for r in &rows {
            let digest = digest_at(r, "digest")?;
            if seen.insert(digest) {
                out.push((digest, labels_at(r, "labels")?));
            }
        }
        Ok(out)
    }

    /// Keeps the outputs a search has still to walk until `expires_at`, under `id`.
    pub async fn save_search(
        &self,
        id: &str,
        ns: &Namespace,
        outputs: &[SearchOutput],
        now: i64,
        expires_at: i64,
    ) -> DbResult<()> {
        let list: Vec<(String, &Labels)> = outputs.iter().map(|(d, l)| (d.hex(), l)).collect();
        let json = serde_json::to_string(&list).map_err(|e| DbError::corrupt("search outputs", e.to_string()))?;
        let (id, ns) = (id.to_owned(), ns.to_string());
        self.write(move |c| {
            Box::pin(async move {
                sqlx::query(
                    "INSERT INTO search_snapshots (id, namespace, outputs, created_at, expires_at) \
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(id)
                .bind(ns)
                .bind(json)
                .bind(now)
                .bind(expires_at)
                .execute(c)
                .await?;
                Ok(())
            })
        })
        .await
    }

    /// The outputs kept under `id` for `ns`, unless they expired (or were never there).
    pub async fn load_search(&self, id: &str, ns: &Namespace, now: i64) -> DbResult<Option<Vec<SearchOutput>>> {
        let row =
            sqlx::query("SELECT outputs FROM search_snapshots WHERE id = $1 AND namespace = $2 AND expires_at > $3")
                .bind(id)
                .bind(ns.as_str())
                .bind(now)
                .fetch_optional(&self.pool)
                .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let json: String = row.try_get("outputs")?;
        let list: Vec<(String, Labels)> =
            serde_json::from_str(&json).map_err(|_| DbError::corrupt("search outputs", json.clone()))?;
        list.into_iter()
            .map(|(hex, labels)| {
                let d = Digest::from_hex(&hex).ok_or_else(|| DbError::corrupt("digest", hex.clone()))?;
                Ok((d, labels))
            })
            .collect::<DbResult<Vec<_>>>()
            .map(Some)
    }

    /// Removes the snapshots of searches that expired; how many went.
    pub async fn delete_expired_searches(&self, now: i64) -> DbResult<u64> {
        self.write(move |c| {
            Box::pin(async move {
                let r = sqlx::query("DELETE FROM search_snapshots WHERE expires_at <= $1").bind(now).execute(c).await?;
                Ok(r.rows_affected())
            })
        })
        .await
    }
}
