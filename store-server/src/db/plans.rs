//! The statements that a timer runs, or that a request runs against a table that grows with the
//! store, each with the index its plan must use — so that a pass or a request costs what it
//! does, not what the store holds. The integration suite's `plans` test asks each database
//! (SQLite, and PostgreSQL with sequential scans priced out) for each plan and checks it.

use sqlx::Row;

use super::error::DbResult;
use super::pool::{Backend, Db};

/// A value bound to a placeholder of a statement being planned.
#[derive(Debug, Clone)]
pub enum Bind {
    /// A `BIGINT`.
    Int(i64),
    /// A `TEXT`.
    Text(&'static str),
}

/// A statement and the index its plan must go through.
#[derive(Debug, Clone)]
pub struct Planned {
    /// What runs it.
    pub name: &'static str,
    /// The statement.
    pub sql: String,
    /// Its parameters.
    pub binds: Vec<Bind>,
    /// The index it must use: (on SQLite, on PostgreSQL).
    pub index: (&'static str, &'static str),
}

/// Every statement the check covers.
pub fn statements() -> Vec<Planned> {
    use Bind::{Int, Text};
    let ns = Text("ns");
    let digest = Text("00");
    let p = |name, sql: &str, binds, index| Planned { name, sql: sql.to_owned(), binds, index };
    vec![
        p(
            "retention: expired references",
            super::retention::EXPIRED_REFS,
            vec![Int(0), Int(500)],
            ("refs_expires", "refs_expires"),
        ),
        p(
            "retention: one page of the walk for blobs nobody references",
            super::retention::UNREFERENCED_WALK,
            vec![digest.clone(), Int(0), Int(500)],
            ("sqlite_autoindex_blobs_1", "blobs_pkey"),
        ),
        p(
            "retention: the grace of blobs a page of expired references leaves",
            &super::retention::mark_all_sql(2),
            vec![Int(0), digest.clone(), Text("01")],
            ("sqlite_autoindex_blobs_1", "blobs_pkey"),
        ),
        p(
            "retention: blobs past their grace",
            super::retention::COLLECTABLE,
            vec![Int(0), digest.clone(), Int(500)],
            ("blobs_in_grace", "blobs_in_grace"),
        ),
        p(
            "retention: deletions left half-done",
            super::retention::STALE_DELETIONS,
            vec![Int(0), digest.clone(), Int(500)],
            ("blobs_deleting", "blobs_deleting"),
        ),
        p(
            "retention: expired streams",
            super::retention::EXPIRED_STREAMS,
            vec![Int(0), Int(500)],
            ("streams_expires", "streams_expires"),
        ),
        p(
            "refs: the references to one output (the viewer's header)",
            &super::blobs::list_refs_sql(0, true),
            vec![ns.clone(), Int(0), Int(i64::MAX), digest.clone(), Int(2)],
            ("refs_digest_ns_id", "refs_digest_ns_id"),
        ),
        p(
            "retention: expired searches",
            "DELETE FROM search_snapshots WHERE expires_at <= $1",
            vec![Int(0)],
            ("search_snapshots_expires", "search_snapshots_expires"),
        ),
        p(
            "retention: packs noted for a check",
            super::chunks::PACK_CHECKS,
            vec![Text(""), Int(500)],
            ("sqlite_autoindex_pack_checks_1", "pack_checks_pkey"),
        ),
        p(
            "retention: pack deletions left half-done",
            super::chunks::STALE_PACK_DELETIONS,
            vec![Int(0), Int(500)],
            ("packs_deleting", "packs_deleting"),
        ),
        p(
            "compaction: blobs old enough",
            super::chunks::COMPACTABLE,
            vec![Int(0), Int(0), digest.clone(), Int(200)],
            ("blobs_compactable", "blobs_compactable"),
        ),
        p(
            "request: a namespace's references, newest first",
            "SELECT r.id FROM refs r WHERE r.namespace = $1 AND (r.pinned = 1 OR r.expires_at > $2) AND r.id < $3 \
             ORDER BY r.id DESC LIMIT $4",
            vec![ns.clone(), Int(0), Int(i64::MAX), Int(100)],
            ("refs_ns_id", "refs_ns_id"),
        ),
        p(
            "request: a page of a search's walk",
            &format!("{} ORDER BY r.id DESC LIMIT $6", super::search::SEARCH_PAGE),
            vec![ns.clone(), Int(0), Int(i64::MIN), Int(i64::MAX), Int(i64::MAX), Int(500)],
            ("refs_ns_id", "refs_ns_id"),
        ),
        p(
            "request: what a search has passed",
            "SELECT digest FROM search_seen WHERE search = $1 AND digest IN ($2, $3)",
            vec![Text("s"), Text("a"), Text("b")],
            ("sqlite_autoindex_search_seen_1", "search_seen_pkey"),
        ),
        p(
            "retention: what expired searches passed",
            "DELETE FROM search_seen WHERE expires_at <= $1",
            vec![Int(0)],
            ("search_seen_expires", "search_seen_expires"),
        ),
        p(
            "request: a blob a namespace may read",
            &format!(
                "SELECT digest FROM blobs b WHERE {} AND b.digest = $3 AND b.state = 'live'",
                super::blobs::VISIBLE
            ),
            vec![ns, Int(0), digest],
            ("refs_digest_ns_id", "refs_digest_ns_id"),
        ),
    ]
}

impl Db {
    /// The database's plan for `sql` with `binds`, one step a line: SQLite's `EXPLAIN QUERY
    /// PLAN`; PostgreSQL's `EXPLAIN` with sequential scans priced out (`enable_seqscan = off`),
    /// so that a table of a few test rows is planned as a large one would be, an index used
    /// wherever one can be.
    pub async fn plan(&self, sql: &str, binds: &[Bind]) -> DbResult<Vec<String>> {
        let mut tx = self.pool.begin().await?;
        let explain = match self.backend {
            Backend::Sqlite => format!("EXPLAIN QUERY PLAN {sql}"),
            Backend::Postgres => {
                sqlx::query("SET LOCAL enable_seqscan = off").execute(&mut *tx).await?;
                format!("EXPLAIN {sql}")
            }
        };
        let mut q = sqlx::query(&explain);
        for b in binds {
            q = match b {
                Bind::Int(v) => q.bind(*v),
                Bind::Text(v) => q.bind(*v),
            };
        }
        let rows = q.fetch_all(&mut *tx).await?;
        tx.rollback().await?;
        let column = match self.backend {
            Backend::Sqlite => "detail",
            Backend::Postgres => "QUERY PLAN",
        };
        rows.iter().map(|r| Ok(r.try_get::<String, _>(column)?)).collect()
    }
}
