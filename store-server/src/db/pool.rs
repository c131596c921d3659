//! The database handle: one pool for PostgreSQL or SQLite, and on SQLite one writer task that
//! commits waiting writes together (group commit). The writer runs most writes through sqlx; the
//! hottest (a small upload's rows) it runs "natively", on a rusqlite connection to the same
//! file, with cached statements and no hop to sqlx's worker thread per statement. The
//! row-level operations live beside it.

use super::error::{DbError, DbResult};
use spillway_api::Digest;
use std::time::Duration;

use anyhow::Context as _;
use futures::future::BoxFuture;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyConnection, AnyPool, Connection, Executor, Row as _};
use tokio::sync::{mpsc, oneshot};

/// Which SQL dialect the pool speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The embedded default.
    Sqlite,
    /// Shared by replicas.
    Postgres,
}

/// Most writes one SQLite group commit takes.
const GROUP_MAX: usize = 256;

/// Histogram of the writes each SQLite group commit made durable together.
pub const GROUP_WRITES: &str = "spillway_db_group_commit_writes";
/// Histogram of the time of each SQLite group commit (statements and COMMIT).
pub const GROUP_SECONDS: &str = "spillway_db_group_commit_seconds";

/// Records one group commit of `writes` writes begun at `began`.
fn record_group(writes: usize, began: std::time::Instant) {
    metrics::histogram!(GROUP_WRITES).record(writes as f64);
    metrics::histogram!(GROUP_SECONDS).record(began.elapsed().as_secs_f64());
}

/// A write waiting for the SQLite group commit: runs its statements, then hears the outcome.
enum Job {
    Sqlx(SqlxJob),
    Native(NativeJob),
}
type SqlxJob = Box<dyn for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, Finisher> + Send>;
type NativeJob = Box<dyn FnOnce(&rusqlite::Connection) -> Finisher + Send>;
type Finisher = Box<dyn FnOnce(DbResult<()>) + Send>;

/// Handle to the metadata database; cheap to clone.
#[derive(Debug, Clone)]
pub struct Db {
    pub(super) pool: AnyPool,
    pub(super) backend: Backend,
    group: Option<mpsc::Sender<Job>>,
    /// Whether the SQLite writer has its native connection (not for an in-memory database).
    native: bool,
    /// The writes' work, which tests compare to show that two paths cost the same.
    work: std::sync::Arc<WriteWork>,
}

/// What the writes cost, counted as they are made.
#[derive(Debug, Default)]
struct WriteWork {
    /// Write transactions committed (each one fsync on SQLite).
    commits: std::sync::atomic::AtomicU64,
    /// Pages the SQLite writer's native connection wrote to the log in its group commits.
    pages: std::sync::atomic::AtomicU64,
}

/// How often the SQLite writer empties `blob_echoes` (see `db::blobs::echo_row`): by the
/// clock, never by how many rows it holds, which re-uploads alone would move.
pub(super) const ECHO_PURGE_EVERY: Duration = Duration::from_secs(10);

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// Every connection's settings. `wal_autocheckpoint=500`: the commit that takes the log past
/// 500 pages folds it into the database (copies and fsyncs), and the writes waiting behind
/// that commit wait for the fold; half the former 1,000 pages halves the longest wait. 4 KiB
/// uploads on 16 connections (`bench/run-ab.sh BASE small`): p99 8.3-12.7 -> 5.8-7.1 ms,
/// uploads/s unchanged; beside two 1 GiB downloads (`bench/run-heavy.sh`) p99 14-18 -> 7-9 ms.
const SQLITE_PRAGMAS: &str =
    "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON; PRAGMA busy_timeout=10000; PRAGMA wal_autocheckpoint=500;";

impl Db {
    /// Connects and applies the migrations of the URL's backend.
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres
        } else if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else {
            anyhow::bail!("unsupported database URL {url:?}: expected sqlite://… or postgres://…");
        };
        let options: AnyConnectOptions = url.parse()?;
        match backend {
            Backend::Sqlite => {
                let native = native_path(url)?;
                let schema = match &native {
                    Some(path) => Some(schema_lock(path).await?),
                    None => None,
                };
                let mut writer = AnyConnection::connect_with(&options).await?;
                writer.execute(SQLITE_PRAGMAS).await?;
                SQLITE_MIGRATIONS.run(&mut writer).await?;
                drop(schema);
                let pool = AnyPoolOptions::new()
                    .max_connections(4)
                    .acquire_timeout(Duration::from_secs(30))
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            conn.execute(SQLITE_PRAGMAS).await?;
                            Ok(())
                        })
                    })
                    .connect_with(options)
                    .await?;
                let first = native.as_deref().map(open_native).transpose()?;
                let (tx, rx) = mpsc::channel(1024);
                let has_native = native.is_some();
                let work = std::sync::Arc::<WriteWork>::default();
                let purged = std::time::Instant::now();
                let (runtime, work_) = (tokio::runtime::Handle::current(), std::sync::Arc::clone(&work));
                let native_writer = native.map(|path| NativeWriter { path, conn: first, purged });
                std::thread::Builder::new()
                    .name("spillway-db-writer".into())
                    .spawn(move || group_commit(&runtime, writer, native_writer, rx, work_))
                    .context("cannot start the database writer")?;
                Ok(Self { pool, backend, group: Some(tx), native: has_native, work })
            }
            Backend::Postgres => {
                let pool = AnyPoolOptions::new()
                    .max_connections(16)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect_with(options)
                    .await?;
                POSTGRES_MIGRATIONS.run(&pool).await?;
                Ok(Self { pool, backend, group: None, native: false, work: Default::default() })
            }
        }
    }

    /// A page of `(digest, size)` rows from a query binding `$1` = `bound`, `$2` = the digest
    /// the page starts after (from the first when `None`) and `$3` = `limit`: how retention
    /// and compaction list what they take next, in key order.
    pub(super) async fn page_of_sizes(
        &self,
        sql: &'static str,
        bound: i64,
        after: Option<&Digest>,
        limit: i64,
    ) -> DbResult<Vec<(Digest, u64)>> {
        let rows = sqlx::query(sql)
            .bind(bound)
            .bind(after.map_or_else(String::new, Digest::hex))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| Ok((digest_at(r, "digest")?, r.try_get::<i64, _>("size")? as u64))).collect()
    }

    /// Write transactions this handle has committed (or tried to: counted as the COMMIT is
    /// sent); on SQLite, its group commits.
    pub fn commits(&self) -> u64 {
        self.work.commits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Pages the SQLite writer's native connection has written to the log in its group
    /// commits (0 on PostgreSQL): what tests compare to show that two paths write alike.
    pub fn log_pages(&self) -> u64 {
        self.work.pages.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Rows in `blob_echoes`, which the SQLite writer empties every [`ECHO_PURGE_EVERY`]:
    /// what tests look at to see that it does.
    pub async fn echo_rows(&self) -> DbResult<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM blob_echoes").fetch_one(&self.pool).await?)
    }

    /// How many independent writes a pass keeps in flight (claims and deletions, each a
    /// transaction of its own on its own row): on SQLite they queue for the one writer, which
    /// commits up to this many together (one fsync; one at a time, 10,000 deletions took 25 s
    /// at 1 M outputs, 2,300 commits 7 s of 9 at 16); on PostgreSQL each holds one of the pool's
    /// 16 connections, so a quarter of them, the rest left to requests.
    pub fn writes_at_once(&self) -> usize {
        match self.backend {
            Backend::Sqlite => 64,
            Backend::Postgres => 4,
        }
    }

    /// The dialect in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Runs `op` as one write transaction and answers once it is durable.
    pub(crate) async fn write<T, F>(&self, op: F) -> DbResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, DbResult<T>> + Send + 'static,
    {
        self.write_with(true, op).await
    }

    /// Like [`Db::write`], for a write whose every prefix is harmless if a later statement of
    /// it fails (a blob row with no reference yet is simply collected): on SQLite it skips
    /// its savepoint, one statement fewer on the hot path of small uploads.
    pub(crate) async fn write_prefix_safe<T, F>(&self, op: F) -> DbResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, DbResult<T>> + Send + 'static,
    {
        self.write_with(false, op).await
    }

    async fn write_with<T, F>(&self, guarded: bool, op: F) -> DbResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, DbResult<T>> + Send + 'static,
    {
        let Some(group) = &self.group else {
            let mut tx = self.pool.begin().await?;
            let out = op(&mut tx).await?;
            self.work.commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed); // before: readers see it once done
            tx.commit().await?;
            return Ok(out);
        };
        let (reply, answer) = oneshot::channel::<DbResult<T>>();
        let job: SqlxJob = Box::new(move |conn| {
            Box::pin(async move {
                // Savepoints stack up and are all released by the batch's COMMIT; a failing
                // write rolls back to its own (the most recent of that name) and no further.
                let saved = if guarded {
                    conn.execute("SAVEPOINT op").await.map(|_| ()).map_err(DbError::from)
                } else {
                    Ok(())
                };
                let result = match saved {
                    Err(e) => Err(e),
                    Ok(()) => {
                        let r = op(&mut *conn).await;
                        if r.is_err() && guarded {
                            let _ = conn.execute("ROLLBACK TO SAVEPOINT op").await;
                        }
                        r
                    }
                };
                let finish: Finisher = Box::new(move |committed| {
                    let _ = reply.send(match committed {
                        Ok(()) => result,
                        Err(e) => Err(e),
                    });
                });
                finish
            })
        });
        let closed = || DbError::from(sqlx::Error::PoolClosed);
        group.send(Job::Sqlx(job)).await.map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }

    /// Whether writes with nothing to complete inside them go through the SQLite writer's own
    /// connection ([`Db::write_native`]), which finds the content's row itself.
    pub(crate) fn writes_natively(&self) -> bool {
        self.group.is_some() && self.native
    }

    /// Runs `op` on the SQLite writer's own rusqlite connection, in its group commit, and
    /// answers once it is durable; `None` when there is no such writer (PostgreSQL, an
    /// in-memory database), for the caller to go through [`Db::write`]. Like
    /// [`Db::write_prefix_safe`], `op` has no savepoint: every prefix of it must be harmless.
    pub(crate) async fn write_native<T, F>(&self, op: F) -> Option<DbResult<T>>
    where
        T: Send + 'static,
        F: FnOnce(&rusqlite::Connection) -> DbResult<T> + Send + 'static,
    {
        let group = self.group.as_ref().filter(|_| self.writes_natively())?;
        let (reply, answer) = oneshot::channel::<DbResult<T>>();
        let job: NativeJob = Box::new(move |conn| {
            let result = op(conn);
            Box::new(move |committed: DbResult<()>| {
                let _ = reply.send(committed.and(result));
            })
        });
        let closed = || DbError::from(sqlx::Error::PoolClosed);
        if group.send(Job::Native(job)).await.is_err() {
            return Some(Err(closed()));
        }
        Some(answer.await.unwrap_or_else(|_| Err(closed())))
    }

    /// On SQLite, folds the write-ahead log into the database and truncates it: on a full disk
    /// that gives back the log's space (it holds many versions of the same pages), so that a
    /// delete can be written. Best effort; a no-op on PostgreSQL.
    pub async fn reclaim_log(&self) {
        if self.backend == Backend::Sqlite {
            if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)").execute(&self.pool).await {
                tracing::warn!(cause = %e, "could not truncate the SQLite log");
            }
        }
    }

    /// Round-trips a trivial query, for `/readyz`.
    pub async fn ping(&self) -> DbResult<()> {
        Ok(sqlx::query("SELECT 1").execute(&self.pool).await.map(|_| ())?)
    }

    /// Closes the pool.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// The file of a SQLite database URL; `None` for an in-memory database (no native writer).
fn native_path(url: &str) -> anyhow::Result<Option<std::path::PathBuf>> {
    use std::str::FromStr;
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)?;
    let path = options.get_filename();
    let in_memory = path.as_os_str().is_empty() || path.to_string_lossy().contains(":memory:");
    Ok((!in_memory).then(|| path.to_path_buf()))
}

/// An exclusive lock on a file beside SQLite database `db`, held while its schema is brought
/// up to date. sqlx takes no lock around SQLite's migrations: two processes opening one fresh
/// file at once (the server's first start, an operator's `token create` beside it) would both
/// apply the first migration, and the second fail on the tables the first made. With the lock
/// they take turns, and the second finds the schema whole. (PostgreSQL's migrations take an
/// advisory lock of their own.)
async fn schema_lock(db: &std::path::Path) -> anyhow::Result<std::fs::File> {
    let mut name = db.as_os_str().to_owned();
    name.push("-schema.lock");
    let lock = tokio::task::spawn_blocking(move || {
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&name)?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)?;
        std::io::Result::Ok(file)
    });
    lock.await?.context("cannot lock the database's schema")
}

/// The writer's own: it reads the database's pages through a map of the file (up to 1 GiB of
/// it) instead of copying each one it does not hold in its cache with a `pread` — every upload
/// looks up a few pages of indexes keyed by random digests. SQLite still writes through `write`
/// and the log, so what a commit makes durable, and when, is unchanged. 4 KiB uploads on 16
/// connections (`bench/run-ab.sh BASE small`): +9-10% uploads/s, the writer's time in the
/// kernel's copies of pages 9.5% -> 4.3% of it.
const NATIVE_PRAGMAS: &str = "PRAGMA mmap_size=1073741824;";

/// The SQLite writer's own rusqlite connection to the database file.
fn open_native(path: &std::path::Path) -> rusqlite::Result<rusqlite::Connection> {
    let conn = rusqlite::Connection::open(path)?;
    conn.execute_batch(SQLITE_PRAGMAS)?;
    conn.execute_batch(NATIVE_PRAGMAS)?;
    conn.set_prepared_statement_cache_capacity(32);
    Ok(conn)
}

/// The native connection, reopened when a batch lost it (its thread panicked).
struct NativeWriter {
    path: std::path::PathBuf,
    conn: Option<rusqlite::Connection>,
    /// When `blob_echoes` was last emptied.
    purged: std::time::Instant,
}

/// The SQLite writer: takes every write that is waiting and runs them in transactions — the
/// native ones in one on the rusqlite connection, then the others in one through sqlx — each
/// commit one fsync, then answers them all. A thread of its own, so that one commit follows
/// another as soon as writes wait, whatever the runtime's workers are busy with (sending
/// downloads, cutting pages): as a task, each commit went to a blocking thread and back, and
/// the next began only once a worker got to the task again. Runs until every handle is
/// dropped.
fn group_commit(
    runtime: &tokio::runtime::Handle,
    mut conn: AnyConnection,
    mut native: Option<NativeWriter>,
    mut rx: mpsc::Receiver<Job>,
    work: std::sync::Arc<WriteWork>,
) {
    while let Some(first) = rx.blocking_recv() {
        let mut jobs = vec![first];
        while jobs.len() < GROUP_MAX {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        let (mut natives, mut others) = (Vec::new(), Vec::new());
        for job in jobs {
            match job {
                Job::Native(j) => natives.push(j),
                Job::Sqlx(j) => others.push(j),
            }
        }
        // Never sent without a native writer. Without a connection (not reopened), the jobs
        // are dropped and their callers answered `Unavailable`.
        if let (false, Some(w)) = (natives.is_empty(), native.as_mut()) {
            let reopened =
                || open_native(&w.path).map_err(|e| tracing::error!(cause = %e, "cannot reopen SQLite")).ok();
            if let Some(c) = w.conn.take().or_else(reopened) {
                let purge = w.purged.elapsed() >= ECHO_PURGE_EVERY;
                if purge {
                    w.purged = std::time::Instant::now();
                }
                w.conn = commit_native(c, natives, &work, purge);
            }
        }
        if !others.is_empty() {
            runtime.block_on(commit_sqlx(&mut conn, others, &work.commits));
        }
    }
}

/// One transaction of native writes; gives the connection back, unless a write panicked
/// (the next commit opens it again; the panicking write's caller hears `Unavailable`, as
/// the others of its group do when their finishers are dropped). With `purge`, once the
/// writes are answered, empties `blob_echoes` in a transaction of its own.
fn commit_native(
    conn: rusqlite::Connection,
    jobs: Vec<NativeJob>,
    work: &WriteWork,
    purge: bool,
) -> Option<rusqlite::Connection> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let began = std::time::Instant::now();
        let writes = jobs.len();
        let mut finishers = Vec::with_capacity(jobs.len());
        let begun = conn.execute_batch("BEGIN IMMEDIATE").map_err(DbError::from);
        if begun.is_ok() {
            finishers.extend(jobs.into_iter().map(|job| job(&conn)));
        }
        // Counted before the COMMIT: a reader may see the rows as soon as it is done.
        work.commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let committed = begun.and_then(|()| {
            conn.execute_batch("COMMIT").map_err(|e| {
                let _ = conn.execute_batch("ROLLBACK");
                DbError::from(e)
            })
        });
        record_group(writes, began);
        if let Err(e) = &committed {
            tracing::error!(cause = ?e, "SQLite group commit failed");
        }
        work.pages.fetch_add(log_pages_since_last_look(&conn), std::sync::atomic::Ordering::Relaxed);
        for f in finishers {
            f(committed.clone());
        }
        if purge {
            if let Err(e) = conn.execute_batch("DELETE FROM blob_echoes") {
                tracing::warn!(cause = %e, "could not empty blob_echoes");
            }
            log_pages_since_last_look(&conn); // the purge's, not the writes'
        }
        conn
    }))
    .ok()
}

/// Pages `conn` wrote to the database's log since the last look (SQLite's
/// `SQLITE_DBSTATUS_CACHE_WRITE`, read and reset).
fn log_pages_since_last_look(conn: &rusqlite::Connection) -> u64 {
    let (mut current, mut highest) = (0, 0);
    // SAFETY: the handle is `conn`'s own, open for the whole call; `sqlite3_db_status` only
    // writes the two integers it is given.
    let rc = unsafe {
        rusqlite::ffi::sqlite3_db_status(
            conn.handle(),
            rusqlite::ffi::SQLITE_DBSTATUS_CACHE_WRITE,
            &mut current,
            &mut highest,
            1,
        )
    };
    if rc == rusqlite::ffi::SQLITE_OK {
        u64::try_from(current).unwrap_or(0)
    } else {
        0
    }
}

/// One transaction of writes through sqlx.
async fn commit_sqlx(conn: &mut AnyConnection, jobs: Vec<SqlxJob>, commits: &std::sync::atomic::AtomicU64) {
    let (began, writes) = (std::time::Instant::now(), jobs.len());
    let begun = conn.execute("BEGIN IMMEDIATE").await.map_err(DbError::from);
    let mut finishers = Vec::with_capacity(jobs.len());
    if begun.is_ok() {
        for job in jobs {
            finishers.push(job(&mut *conn).await);
        }
    }
    commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed); // before: readers see it once done
    let committed = match begun {
        Err(e) => Err(e),
        Ok(_) => match conn.execute("COMMIT").await {
            Ok(_) => Ok(()),
            Err(e) => {
                let _ = conn.execute("ROLLBACK").await;
                Err(DbError::from(e))
            }
        },
    };
    record_group(writes, began);
    if let Err(e) = &committed {
        tracing::error!(cause = ?e, "SQLite group commit failed");
    }
    for f in finishers {
        f(committed.clone());
    }
}

/// The digest a row keeps as 64 hex digits in column `col`.
pub(super) fn digest_at(r: &sqlx::any::AnyRow, col: &str) -> DbResult<spillway_api::Digest> {
    use sqlx::Row;
    let hex: String = r.try_get(col)?;
    spillway_api::Digest::from_hex(&hex).ok_or_else(|| DbError::corrupt("digest", hex))
}

/// Labels a row keeps as a JSON object in column `col`.
pub(super) fn labels_at(r: &sqlx::any::AnyRow, col: &str) -> DbResult<spillway_api::Labels> {
    use sqlx::Row;
    let text: String = r.try_get(col)?;
    serde_json::from_str(&text).map_err(|_| DbError::corrupt("labels", text))
}

/// Labels as a row keeps them.
pub(super) fn labels_json(labels: &spillway_api::Labels) -> String {
    serde_json::to_string(labels).unwrap_or_else(|_| "{}".into())
}

/// Appends to a `refs r` query one condition for each of `labels` label filters (every one must match),
/// numbered from `$n + 1`; returns the last placeholder's number. Bind each key, then its value.
pub(super) fn label_conditions(sql: &mut String, labels: usize, mut n: usize) -> usize {
    for _ in 0..labels {
        sql.push_str(&format!(
            " AND EXISTS (SELECT 1 FROM ref_labels l WHERE l.ref_id = r.id AND l.key = ${} AND l.value = ${})",
            n + 1,
            n + 2
        ));
        n += 2;
    }
    n
}

pub(super) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
